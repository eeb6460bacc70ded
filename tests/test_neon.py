"""The aarch64 paths under emulation: tests/kernels_driver.c with the C kernels (every csrc/*.c)
cross-compiled twice, for the `neon` path (ARMv8.2 with the dot-product extension: sdot integer
products) and the `portable` one (ARMv8.0, without OpenMP: the library's own thread pool), both run
by qemu-user on two threads. Each build must compute every row the same alone as in a batch; the
integer products must give the same bits on both; and the float operations too, which on aarch64
are the same C compiled with and without the extension."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "src/specdecode/models/native/csrc"
SOURCES = [*sorted(CSRC.glob("*.c")), ROOT / "tests/kernels_driver.c"]
COMPILER, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64") or shutil.which(
    "qemu-aarch64-static")

pytestmark = [pytest.mark.slow,  # cross-compiles the kernels twice and runs them under qemu
              pytest.mark.skipif(
                  COMPILER is None or QEMU is None,
                  reason="no aarch64 cross compiler and qemu-user here (Debian: apt-get install gcc-aarch64-linux-gnu "
                         "qemu-user; `make setup` installs them where apt-get runs as root)")]


def run_build(tmp_path, name: str, march: str) -> dict[str, str]:
    binary = tmp_path / name
    flags = ["-O3", f"-march={march}", "-static", "-Wno-psabi", "-pthread", f"-I{CSRC}"]
    subprocess.run([COMPILER, *flags, *map(str, SOURCES), "-o", str(binary), "-lm"], check=True, capture_output=True,
                   text=True)
    done = subprocess.run([QEMU, "-cpu", "max", str(binary), "2"], capture_output=True, text=True, timeout=300)
    lines = done.stdout.splitlines()
    failed = [line for line in lines if line.startswith("rows-alone FAIL")]
    assert done.returncode == 0 and not failed, f"{name}: {failed or done.stderr}"
    assert sum(line.startswith("rows-alone ok") for line in lines) == 16
    return dict(line.split(" ", 1) for line in lines if not line.startswith("rows-alone"))


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The neon build and the portable one (each on its thread pool, two threads)."""
    tmp = tmp_path_factory.mktemp("aarch64")
    return run_build(tmp, "neon", "armv8.2-a+dotprod"), run_build(tmp, "portable", "armv8-a")


INTEGER_PRODUCTS = ("q4q8_matmul", "q40q8_matmul", "q5q8_matmul", "q4kq8_matmul", "q5kq8_matmul", "q8q8_matmul",
                    "q6q8_matmul")


def test_the_neon_and_portable_builds_say_what_they_are(builds):
    neon, portable = builds
    assert neon["isa"] == "neon-dotprod" and portable["isa"] == "aarch64"


def test_the_neon_integer_products_give_the_portable_bits(builds):
    neon, portable = builds
    for name in INTEGER_PRODUCTS:
        assert neon[name] == portable[name], name


def test_every_other_kernel_gives_the_same_bits_with_and_without_the_extension(builds):
    neon, portable = builds
    others = set(neon) - {"isa", *INTEGER_PRODUCTS}
    assert len(others) == 9
    assert [n for n in sorted(others) if neon[n] != portable[n]] == []
