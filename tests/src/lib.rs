//! Test-only crate; the tests live in `tests/`. The library holds what several test
//! targets share: the top-k cases and the CPU emulator of the top-k kernels.

pub mod emu;
pub mod topk_cases;
