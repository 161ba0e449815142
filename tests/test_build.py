"""setup.py's early checks (torch version, build isolation, setuptools, the compiler's C++
runtime) and `python -m fused_ops.info`, without a GPU."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import torch

import fused_ops
from fused_ops import info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup_py():
    """setup.py as a module (its main() runs only as __main__)."""
    spec = importlib.util.spec_from_file_location("fused_ops_setup", os.path.join(ROOT, "setup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_setup(tmp_path, fake_torch_init):
    """Runs `setup.py --version` with a stand-in torch first on PYTHONPATH; (rc, stderr)."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(fake_torch_init)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run(
        [sys.executable, "setup.py", "--version"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.returncode, r.stderr.strip()


def test_another_torch_version_stops_with_one_message(tmp_path):
    rc, err = run_setup(tmp_path, "__version__ = '2.15.0'\n")
    assert rc == 1
    assert err.splitlines()[-1].startswith("fused_ops: found torch 2.15.0")
    assert "builds against torch 2.11.* only" in err
    assert "pip install --no-build-isolation ." in err


def test_isolated_build_without_torch_names_the_torch_outside(tmp_path):
    # What pip's isolated build looks like from inside: torch not importable, while the
    # interpreter's own environment (seen with -E) has it.
    rc, err = run_setup(tmp_path, "raise ImportError('hidden by build isolation')\n")
    assert rc == 1
    assert f"cannot see torch {torch.__version__}" in err
    assert "isolated environment" in err and "pip install --no-build-isolation ." in err


def test_old_setuptools_without_wheel_stops(setup_py, monkeypatch):
    import setuptools

    monkeypatch.setattr(setuptools, "__version__", "65.5.0")
    monkeypatch.setitem(sys.modules, "wheel", None)  # import wheel -> ImportError
    with pytest.raises(SystemExit):
        setup_py.check_wheel_support()
    monkeypatch.setattr(setuptools, "__version__", "70.1.0")
    setup_py.check_wheel_support()  # new enough: no wheel package needed


def test_glibcxx_versions(setup_py):
    text = "GLIBCXX_3.4\0GLIBCXX_3.4.30\0GLIBCXX_3.4.9\0CXXABI_1.3.13\0"
    assert setup_py.glibcxx_max(text) == (3, 4, 30)
    assert setup_py.glibcxx_max("CXXABI_1.3") is None


@pytest.fixture
def toolchain(setup_py):
    """(libstdc++ torch loaded, its newest GLIBCXX, a g++ that links it): the system g++
    where it qualifies (the one check_compiler falls back to)."""
    loaded = setup_py.loaded_libstdcxx()
    if loaded is None or shutil.which("readelf") is None:
        pytest.skip("needs Linux and readelf")
    loaded_max = setup_py.glibcxx_provided(loaded)
    for cxx in ("/usr/bin/g++", "g++"):
        if shutil.which(cxx) and setup_py.runtime_problem(cxx, loaded, loaded_max) is None:
            return loaded, loaded_max, shutil.which(cxx)
    pytest.skip("no g++ here links the libstdc++ torch loaded")


@pytest.fixture
def static_cxx(toolchain, tmp_path):
    """A compiler wrapper that links libstdc++ statically (the kind that crashed)."""
    path = tmp_path / "static-c++"
    path.write_text(f'#!/bin/sh\nexec {toolchain[2]} "$@" -static-libstdc++\n')
    path.chmod(0o755)
    return str(path)


def test_static_libstdcxx_is_a_problem(setup_py, toolchain, static_cxx):
    loaded, loaded_max, _ = toolchain
    problem = setup_py.runtime_problem(static_cxx, loaded, loaded_max)
    assert problem is not None and "statically" in problem


def test_newer_runtime_is_a_problem(setup_py, toolchain):
    loaded, _, gxx = toolchain
    # As if torch ran with a libstdc++ older than what g++'s library needs.
    problem = setup_py.runtime_problem(gxx, loaded, (3, 4, 0))
    assert problem is not None and "GLIBCXX_3.4.0" in problem


def test_bad_default_compiler_is_replaced(
    setup_py, toolchain, static_cxx, tmp_path, monkeypatch, capsys
):
    if toolchain[2] != "/usr/bin/g++":
        pytest.skip("check_compiler falls back to /usr/bin/g++, which does not qualify here")
    (tmp_path / "c++").symlink_to(static_cxx)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    setup_py.check_compiler()
    assert os.environ["CXX"] == "/usr/bin/g++"
    assert os.environ["CC"] == "/usr/bin/gcc"
    assert "building with /usr/bin/g++ instead" in capsys.readouterr().err


def test_bad_compiler_named_in_cxx_stops(setup_py, toolchain, static_cxx, monkeypatch, capsys):
    monkeypatch.setenv("CXX", static_cxx)
    with pytest.raises(SystemExit):
        setup_py.check_compiler()
    err = capsys.readouterr().err
    assert "statically" in err and "CXX=/usr/bin/g++" in err


# ---- python -m fused_ops.info ---------------------------------------------------------------


def test_info_runs_and_reports_the_build(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSED_")}
    r = subprocess.run(
        [sys.executable, "-m", "fused_ops.info"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"fused_ops {fused_ops.__version__}")
    assert f"torch          {torch.__version__}" in out
    assert "C++ compiler" in out
    assert ("not built (CPU kernels only)" in out) != fused_ops.WITH_CUDA
    assert "Overrides: none" in out and "Other FUSED_* variables" not in out

    def info_with(**set_env):
        r = subprocess.run(
            [sys.executable, "-m", "fused_ops.info"],
            cwd=ROOT,
            env=dict(env, **set_env),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    # The spec the extension holds, one key a line; a retired variable is named as unread.
    out = info_with(
        FUSED_OPS_OVERRIDES="matmul.kernel=portable, pdl=0",
        FUSED_NORM_FIXED="0",
        FUSED_OPS_CUDA="0",
    )  # FUSED_OPS_CUDA: a build switch, not an override
    assert "Overrides: matmul.kernel=portable, pdl=0\n  matmul.kernel=portable\n  pdl=0\n" in out
    assert "  FUSED_NORM_FIXED=0  (not read any more" in out
    assert "FUSED_OPS_CUDA" not in out
    # A spec the extension rejects is reported with its error, not listed as in force.
    out = info_with(FUSED_OPS_OVERRIDES="matmul=portable")
    assert "FUSED_OPS_OVERRIDES='matmul=portable' is rejected" in out
    assert "unknown key 'matmul'" in out and "\n  matmul=portable" not in out


def test_info_reads_the_overrides_in_force():
    from fused_ops.overrides import overrides

    base = info.spec_in_force()
    assert base[1] is None
    with overrides("softmax.cluster=0,matmul.kernel=portable"):
        spec, error = info.spec_in_force()
        assert error is None
        assert info.parse_spec(spec)["matmul.kernel"] == "portable"
        assert info.parse_spec(spec)["softmax.cluster"] == "0"
    assert info.spec_in_force() == base


def test_parse_spec():
    assert info.parse_spec("") == {}
    assert info.parse_spec(" pdl = 0 ,, matmul.kernel=hopper,pdl=1") == {
        "pdl": "1",
        "matmul.kernel": "hopper",
    }  # the last value of a key wins


def test_build_info_records_the_toolchain():
    from fused_ops import _build_info as b

    assert b.VERSION == fused_ops.__version__
    assert b.CXX and "/" in b.CXX.split(":")[0]  # the compiler's path and --version line
    if b.WITH_CUDA:
        assert info.parse_arch_list(b.CUDA_ARCH_LIST)


DEFAULT = info.parse_arch_list("8.0+PTX;9.0a")


@pytest.mark.parametrize(
    "cap,archs,want",
    [
        ((9, 0), DEFAULT, ("sass", (9, 0))),
        ((8, 0), DEFAULT, ("sass", (8, 0))),
        ((8, 6), DEFAULT, ("sass", (8, 0))),  # sm_80 code runs on later 8.x
        ((9, 0), info.parse_arch_list("8.0+PTX"), ("ptx", (8, 0))),
        ((10, 0), DEFAULT, ("ptx", (8, 0))),  # sm_90a runs on 9.0 only
        ((9, 0), info.parse_arch_list("9.0"), ("sass", (9, 0))),
        ((7, 5), DEFAULT, None),
    ],
)
def test_code_a_gpu_runs(cap, archs, want):
    assert info.code_for(cap, archs) == want


def test_kernels_a_gpu_gets():
    hopper = " ".join(info.kernels_for((9, 0), DEFAULT))
    assert "Hopper kernel (wgmma + TMA" in hopper and "sm_90 paths" in hopper
    assert "override" not in hopper
    forced = " ".join(info.kernels_for((9, 0), DEFAULT, "matmul.kernel=portable"))
    assert "portable mma.sync kernel (Hopper kernel: override matmul.kernel=portable)" in forced
    # The last value of a key wins, as in the extension's parser.
    back = " ".join(info.kernels_for((9, 0), DEFAULT, "matmul.kernel=portable,matmul.kernel=auto"))
    assert "Hopper kernel (wgmma + TMA" in back
    knobs = " ".join(info.kernels_for((9, 0), DEFAULT, "softmax.cluster=0,pdl=0"))
    assert "override softmax.cluster=0" in knobs and "override pdl=0" in knobs
    ampere = " ".join(info.kernels_for((8, 0), DEFAULT))
    assert "portable mma.sync" in ampere and "needs a compute capability 9.0 GPU" in ampere
    failing = " ".join(info.kernels_for((8, 0), DEFAULT, "matmul.kernel=hopper"))
    assert "the calls fail" in failing and "needs a compute capability 9.0 GPU" in failing
    no_90a = " ".join(info.kernels_for((9, 0), info.parse_arch_list("8.0+PTX")))
    assert "the build has no sm_90a code" in no_90a and "PTX compute_80" in no_90a
    assert "no kernels for this GPU" in info.kernels_for((7, 5), DEFAULT)[0]


# ---- the source tree shadowing an installed build ------------------------------------------


def test_unbuilt_source_tree_falls_back_to_a_built_copy(tmp_path):
    # tmp/fused_ops: the package without its extension (a source tree after `pip install .`),
    # found first; ROOT (built) later on sys.path stands for the installed copy.
    shutil.copytree(
        os.path.join(ROOT, "fused_ops"),
        tmp_path / "fused_ops",
        ignore=shutil.ignore_patterns("_C.*", "__pycache__"),
    )
    code = (
        "import torch, fused_ops; print(fused_ops.gelu(torch.zeros(2)).tolist()); "
        "print(fused_ops._C.__file__)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "[0.0, 0.0]"
    assert r.stdout.splitlines()[1].startswith(os.path.join(ROOT, "fused_ops"))
    assert "has no built extension; using the installed fused_ops" in r.stderr
    # Nothing built anywhere: the one-line "not built" message.
    r = subprocess.run(
        [sys.executable, "-c", "import fused_ops"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=""),
        timeout=120,
    )
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("ImportError: fused_ops is not built")
