// The override table (common/overrides.h): parsing a spec, and the overrides in force.
#include "common/overrides.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace fused {
namespace {

// One key: its name, what it allows (for the error message), and how a value is stored.
// set returns false for a value outside the key's range.
struct Key {
  const char* name;
  const char* allowed;
  bool (*set)(Overrides& o, const std::string& v);
};

bool parse_int(const std::string& v, int lo, int hi, int& out) {
  if (v.empty() || v.size() > 9) return false;
  for (char c : v) {
    if (c < '0' || c > '9') return false;
  }
  const int n = std::atoi(v.c_str());
  if (n < lo || n > hi) return false;
  out = n;
  return true;
}

bool parse_bool(const std::string& v, bool& out) {
  if (v != "0" && v != "1") return false;
  out = v == "1";
  return true;
}

// An integer in [lo, hi], or "auto" (Overrides::kAuto).
bool parse_auto_int(const std::string& v, int lo, int hi, int& out) {
  if (v == "auto") {
    out = Overrides::kAuto;
    return true;
  }
  return parse_int(v, lo, hi, out);
}

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      {"norm.fixed", "0 or 1",
       [](Overrides& o, const std::string& v) { return parse_bool(v, o.norm_fixed); }},
      {"norm.stage", "0 or 1",
       [](Overrides& o, const std::string& v) { return parse_bool(v, o.norm_stage); }},
      {"norm.bwd_warp", "0 or 1",
       [](Overrides& o, const std::string& v) { return parse_bool(v, o.norm_bwd_warp); }},
      {"norm.bwd_pf", "auto, 0 or 1",
       [](Overrides& o, const std::string& v) { return parse_auto_int(v, 0, 1, o.norm_bwd_pf); }},
      {"norm.bwd_warps", "auto or an integer from 1 to 32",
       [](Overrides& o, const std::string& v) {
         return parse_auto_int(v, 1, 32, o.norm_bwd_warps);
       }},
      {"norm.bwd_bulk", "0 or 1",
       [](Overrides& o, const std::string& v) { return parse_bool(v, o.norm_bwd_bulk); }},
      {"norm.bwd_bulk_stages", "auto, 2, 3 or 4",
       [](Overrides& o, const std::string& v) {
         return parse_auto_int(v, 2, 4, o.norm_bwd_bulk_stages);
       }},
      {"softmax.cluster", "0 or 1",
       [](Overrides& o, const std::string& v) { return parse_bool(v, o.softmax_cluster); }},
      {"softmax.max_cluster", "an integer from 2 to 16",
       [](Overrides& o, const std::string& v) {
         return parse_int(v, 2, 16, o.softmax_max_cluster);
       }},
      {"softmax.min_block", "32, 64 or 128",
       [](Overrides& o, const std::string& v) {
         return (v == "32" || v == "64" || v == "128") &&
                parse_int(v, 32, 128, o.softmax_min_block);
       }},
      {"softmax.staged", "0 or 1",
       [](Overrides& o, const std::string& v) { return parse_bool(v, o.softmax_staged); }},
      {"softmax.causal", "0 or 1",
       [](Overrides& o, const std::string& v) { return parse_bool(v, o.softmax_causal); }},
      {"matmul.kernel", "auto, portable or hopper",
       [](Overrides& o, const std::string& v) {
         using K = Overrides::MatmulKernel;
         if (v == "auto")
           o.matmul_kernel = K::kAuto;
         else if (v == "portable")
           o.matmul_kernel = K::kPortable;
         else if (v == "hopper")
           o.matmul_kernel = K::kHopper;
         else
           return false;
         return true;
       }},
      {"matmul.group_m", "an integer from 1 to 1024",
       [](Overrides& o, const std::string& v) { return parse_int(v, 1, 1024, o.matmul_group_m); }},
      {"matmul.tile_n", "auto, 128 or 256",
       [](Overrides& o, const std::string& v) {
         return (v == "auto" || v == "128" || v == "256") &&
                parse_auto_int(v, 128, 256, o.matmul_tile_n);
       }},
      {"matmul.split_k", "auto or an integer from 1 to 64",
       [](Overrides& o, const std::string& v) {
         return parse_auto_int(v, 1, 64, o.matmul_split_k);
       }},
      {"pdl", "0 or 1", [](Overrides& o, const std::string& v) { return parse_bool(v, o.pdl); }},
  };
  return table;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::string key_list() {
  std::string out;
  for (const Key& k : keys()) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

// The overrides in force and their spec. Each set_overrides adds an entry that is never
// freed, so a reference overrides() handed out stays valid; sets are rare (tests, tools).
struct State {
  std::mutex mutex;
  std::deque<std::pair<Overrides, std::string>> history;
  std::atomic<const std::pair<Overrides, std::string>*> current{nullptr};

  State() {
    const char* env = std::getenv("FUSED_OPS_OVERRIDES");
    const std::string spec = env != nullptr ? env : "";
    Overrides o;
    try {
      o = parse_overrides(spec);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "FUSED_OPS_OVERRIDES='", spec, "': ", e.msg());
    }
    history.emplace_back(o, spec);
    current.store(&history.back(), std::memory_order_release);
  }
};

State& state() {
  static State s;  // FUSED_OPS_OVERRIDES read here, once
  return s;
}

}  // namespace

Overrides parse_overrides(const std::string& spec) {
  Overrides o;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = trim(spec.substr(start, end - start));
    start = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    TORCH_CHECK(eq != std::string::npos, "fused overrides: expected key=value, but got '", item,
                "' (keys: ", key_list(), ")");
    const std::string name = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
    const Key* key = nullptr;
    for (const Key& k : keys()) {
      if (name == k.name) key = &k;
    }
    TORCH_CHECK(key != nullptr, "fused overrides: unknown key '", name, "' (keys: ", key_list(),
                ")");
    TORCH_CHECK(key->set(o, value), "fused overrides: ", name, " must be ", key->allowed,
                ", but got '", value, "'");
  }
  return o;
}

const Overrides& overrides() { return state().current.load(std::memory_order_acquire)->first; }

std::string set_overrides(const std::string& spec) {
  Overrides o = parse_overrides(spec);  // throws before anything changes
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::string previous = s.current.load(std::memory_order_relaxed)->second;
  s.history.emplace_back(o, spec);
  s.current.store(&s.history.back(), std::memory_order_release);
  return previous;
}

std::string overrides_spec() { return state().current.load(std::memory_order_acquire)->second; }

}  // namespace fused
