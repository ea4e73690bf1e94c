// The derive describes one model: enums and unions are rejected.
use nsa_macros::NsaKernels;

#[derive(NsaKernels)]
#[nsa(preset = "deepseek-v3.2")]
enum Model {
    A,
    B,
}

fn main() {}
