// Names the runtime's parsers reject: preset, cache format, target.
use nsa_macros::NsaKernels;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3")]
struct Preset;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2", kv_cache = "fp16", targets("sm_90a", "sm_80"))]
struct Names;

fn main() {}
