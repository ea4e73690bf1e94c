//! Compilation targets: arch strings, wave width, and which toolchain builds them.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A GPU architecture we generate code for. New targets add a variant here and a
/// header directory under `include/nsa/`; nothing else keys on the arch string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Target {
    /// NVIDIA Hopper (H100/H200), arch-specific features enabled.
    #[serde(rename = "sm_90a")]
    Sm90a,
    /// NVIDIA Blackwell datacenter (B200), arch-specific features enabled.
    #[serde(rename = "sm_100a")]
    Sm100a,
    /// AMD MI300X/MI325X (CDNA3).
    #[serde(rename = "gfx942")]
    Gfx942,
}

/// GPU vendor, which selects the arch header directory and the toolchain family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Vendor {
    Nvidia,
    Amd,
}

/// Which compiler turns our source into a loadable image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Toolchain {
    /// NVRTC at run time (also usable without a GPU).
    Nvrtc,
    /// hipRTC at run time, or clang offline (`-x hip --offload-arch=...`).
    Hip,
}

/// What a compile produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// NVIDIA SASS for one exact arch.
    Cubin,
    /// AMD code object (ELF) for one exact arch.
    HsaCodeObject,
}

impl Target {
    pub const ALL: [Target; 3] = [Target::Sm90a, Target::Sm100a, Target::Gfx942];
    pub const NVIDIA: [Target; 2] = [Target::Sm90a, Target::Sm100a];

    /// The arch string the compiler takes (`sm_90a`, `gfx942`).
    pub fn arch(self) -> &'static str {
        match self {
            Target::Sm90a => "sm_90a",
            Target::Sm100a => "sm_100a",
            Target::Gfx942 => "gfx942",
        }
    }

    pub fn vendor(self) -> Vendor {
        match self {
            Target::Sm90a | Target::Sm100a => Vendor::Nvidia,
            Target::Gfx942 => Vendor::Amd,
        }
    }

    /// Whether the target has programmatic dependent launch (sm_90+).
    pub fn has_pdl(self) -> bool {
        self.vendor() == Vendor::Nvidia
    }

    /// Whether the target has thread-block clusters and distributed shared memory.
    pub fn has_clusters(self) -> bool {
        self.vendor() == Vendor::Nvidia
    }

    pub fn toolchain(self) -> Toolchain {
        match self.vendor() {
            Vendor::Nvidia => Toolchain::Nvrtc,
            Vendor::Amd => Toolchain::Hip,
        }
    }

    pub fn output_kind(self) -> OutputKind {
        match self.vendor() {
            Vendor::Nvidia => OutputKind::Cubin,
            Vendor::Amd => OutputKind::HsaCodeObject,
        }
    }

    /// Hardware threads per warp/wavefront.
    pub fn warp_size(self) -> u32 {
        match self.vendor() {
            Vendor::Nvidia => 32,
            Vendor::Amd => 64,
        }
    }

    /// Largest dynamic shared memory (LDS) one block may use, in bytes.
    pub fn max_smem_per_block(self) -> u32 {
        match self {
            Target::Sm90a | Target::Sm100a => 227 * 1024,
            Target::Gfx942 => 64 * 1024,
        }
    }

    /// Compute capability (major, minor) for NVIDIA targets.
    pub fn compute_capability(self) -> Option<(u32, u32)> {
        match self {
            Target::Sm90a => Some((9, 0)),
            Target::Sm100a => Some((10, 0)),
            Target::Gfx942 => None,
        }
    }

    /// The NVIDIA target whose arch-specific (`a`) features match a device of
    /// compute capability `cc`, if we generate for it.
    pub fn from_compute_capability(cc: (u32, u32)) -> Option<Target> {
        Target::NVIDIA.into_iter().find(|t| t.compute_capability() == Some(cc))
    }

    /// Header directory under `include/nsa/` holding this target's arch layer.
    pub fn arch_header(self) -> &'static str {
        match self.vendor() {
            Vendor::Nvidia => "nsa/cuda/arch.cuh",
            Vendor::Amd => "nsa/rocm/arch.cuh",
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.arch())
    }
}

/// A target name that is not one of [`Target::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown target `{0}`: allowed sm_90a, sm_100a, gfx942 (NVIDIA H100/H200 = sm_90a, B200 = sm_100a, MI300X = gfx942)")]
pub struct UnknownTarget(pub String);

impl FromStr for Target {
    type Err = UnknownTarget;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('-', "_");
        Target::ALL
            .into_iter()
            .find(|t| t.arch() == norm || t.arch().replace('_', "") == norm)
            .ok_or_else(|| UnknownTarget(s.to_string()))
    }
}
