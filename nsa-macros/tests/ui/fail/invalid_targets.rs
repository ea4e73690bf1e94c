// Invalid combinations within `targets`: a repeat (spanned on the repeat), none at all.
use nsa_macros::NsaKernels;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", targets("sm_90a", "sm_100a", "sm_90a"))]
struct Repeated;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", targets())]
struct Empty;

fn main() {}
