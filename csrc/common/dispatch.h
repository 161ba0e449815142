// dtype dispatch: one macro per backend so every kernel is instantiated only for the
// dtypes that backend accepts (see checks.h).
#pragma once
#include <ATen/Dispatch.h>

// NAME must be a string literal (it is used in constant expressions).
// CPU: float64 (for gradcheck), float32, float16, bfloat16.
#define FUSED_DISPATCH_CPU(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

// CUDA: float32, float16, bfloat16.
#define FUSED_DISPATCH_CUDA(TYPE, NAME, ...)                                     \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                                 \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE( \
                         at::kHalf, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))
