"""Drop-in replacements of the kernel calls SGLang's NSA backend makes: same
names, argument order, defaults, dtypes and output shapes; switch by changing the
import. An argument nsa cannot honour raises ``NotImplementedError`` naming it."""

from . import deep_gemm, flash_mla, sgl_kernel

__all__ = ["deep_gemm", "flash_mla", "sgl_kernel"]
