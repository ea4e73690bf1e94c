//! Offline clang (`-x hip`) → linked AMDGPU HSA code object (what `hipModuleLoad` takes).
//!
//! No ROCm install is needed: the source includes only our embedded headers (the AMD
//! arch layer uses clang builtins), device libraries are not linked (`-nogpulib`) and
//! clang's HIP wrapper headers are not included (`-nogpuinc`). What is needed is a
//! clang ≥ 17 built with the AMDGPU backend plus its `ld.lld` (Debian/Ubuntu:
//! `apt-get install clang-19 lld-19`).
//!
//! Every compile runs in a fresh temporary directory holding the source and every
//! entry of [`HEADERS`]; the output is checked (ELF, `EM_AMDGPU`, gfx942, kernel
//! symbol and descriptor exported) before it is returned.

use super::{CompiledImage, Compiler, CompilerIdentity, ResourceUsage};
use crate::error::{Error, Result};
use nsa_kernels::{OutputKind, RenderedKernel, Target, Vendor, HEADERS};
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Environment variable naming the clang to use (a path, or a name looked up on `PATH`).
pub const CLANG_ENV: &str = "NSA_HIP_CLANG";
/// Oldest clang major version accepted.
pub const MIN_CLANG_MAJOR: u32 = 17;
/// Names looked up on `PATH` when [`CLANG_ENV`] is unset, in order.
pub const CLANG_NAMES: &[&str] = &["clang-19", "clang", "clang-20", "clang-18", "clang-17"];
/// ROCm's bundled clang, tried after [`CLANG_NAMES`] (`$ROCM_PATH/llvm/bin/clang` first).
const ROCM_CLANG: &str = "/opt/rocm/llvm/bin/clang";

const INSTALL_HINT: &str = "install clang (>= 17, with the AMDGPU backend) and lld, e.g. \
     `apt-get install clang-19 lld-19` on Debian 12 / Ubuntu 24.04, or set NSA_HIP_CLANG \
     to a clang binary (e.g. /opt/rocm/llvm/bin/clang)";

/// `e_machine` of AMDGPU ELF files.
pub const EM_AMDGPU: u16 = 224;
/// `e_flags & EF_AMDGPU_MACH` of a gfx942 code object.
pub const EF_AMDGPU_MACH_GFX942: u32 = 0x04c;
const EF_AMDGPU_MACH: u32 = 0x0ff;
const ET_DYN: u16 = 3;

/// Environment variables that would silently add include paths or driver arguments.
const SCRUBBED_ENV: &[&str] =
    &["CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "CCC_OVERRIDE_OPTIONS"];

/// Kernel used to check, once, that the located clang can produce a gfx942 code object.
const PROBE_SYMBOL: &str = "nsa_clang_hip_probe";
const PROBE_SOURCE: &str =
    "extern \"C\" __attribute__((global)) void nsa_clang_hip_probe(unsigned* p) { if (p) *p = 1u; }\n";

/// clang driving the HIP device toolchain offline, for [`Target::Gfx942`].
#[derive(Clone, Debug)]
pub struct ClangHipCompiler {
    clang: PathBuf,
    major: u32,
    identity: CompilerIdentity,
}

impl ClangHipCompiler {
    /// Locates clang: `$NSA_HIP_CLANG` if set (no fallback then), else the first of
    /// [`CLANG_NAMES`] on `PATH`, then ROCm's clang, that passes the checks of
    /// [`with_clang`](Self::with_clang).
    pub fn new() -> Result<Self> {
        if let Some(v) = std::env::var_os(CLANG_ENV).filter(|v| !v.is_empty()) {
            let path = resolve(Path::new(&v)).ok_or_else(|| {
                Error::Other(format!(
                    "{CLANG_ENV}={} is neither an executable file nor a program on PATH; {INSTALL_HINT}",
                    Path::new(&v).display()
                ))
            })?;
            return Self::with_clang(&path)
                .map_err(|e| Error::Other(format!("{CLANG_ENV}={}: {e}", Path::new(&v).display())));
        }
        let mut tried = Vec::new();
        let mut candidates: Vec<PathBuf> = CLANG_NAMES.iter().map(PathBuf::from).collect();
        if let Some(rocm) = std::env::var_os("ROCM_PATH").filter(|v| !v.is_empty()) {
            candidates.push(Path::new(&rocm).join("llvm/bin/clang"));
        }
        candidates.push(PathBuf::from(ROCM_CLANG));
        for cand in &candidates {
            match resolve(cand) {
                None => tried.push(format!("{} (not found)", cand.display())),
                Some(path) => match Self::with_clang(&path) {
                    Ok(c) => return Ok(c),
                    Err(e) => {
                        let why = e.to_string().replace(&format!("; {INSTALL_HINT}"), "");
                        tried.push(format!("{} (rejected: {why})", path.display()))
                    }
                },
            }
        }
        Err(Error::Other(format!(
            "no usable clang for HIP/gfx942 offline compiles; {CLANG_ENV} is unset and tried on PATH={}:\n  {}\n{INSTALL_HINT}",
            std::env::var("PATH").unwrap_or_default(),
            tried.join("\n  ")
        )))
    }

    /// Uses the clang at `clang` after checking its version (≥ [`MIN_CLANG_MAJOR`]),
    /// that it has the `amdgcn` target, and that a trial kernel compiles and links to
    /// a gfx942 code object (this catches a missing `ld.lld`).
    pub fn with_clang(clang: impl AsRef<Path>) -> Result<Self> {
        let clang = clang.as_ref().to_path_buf();
        let out = run_capture(Command::new(&clang).arg("--version"))
            .map_err(|e| Error::Other(format!("cannot run `{} --version`: {e}", clang.display())))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let first = text.lines().next().unwrap_or("").trim().to_string();
        let major = parse_clang_major(&first).ok_or_else(|| {
            Error::Other(format!("`{} --version` does not look like clang (first line: {first:?})", clang.display()))
        })?;
        if major < MIN_CLANG_MAJOR {
            return Err(Error::Other(format!(
                "{} is clang {major}; gfx942 needs clang >= {MIN_CLANG_MAJOR}; {INSTALL_HINT}",
                clang.display()
            )));
        }
        let targets = run_capture(Command::new(&clang).arg("--print-targets"))
            .map_err(|e| Error::Other(format!("cannot run `{} --print-targets`: {e}", clang.display())))?;
        if !String::from_utf8_lossy(&targets.stdout).contains("amdgcn") {
            return Err(Error::Other(format!(
                "{} was built without the AMDGPU (amdgcn) backend; {INSTALL_HINT}",
                clang.display()
            )));
        }
        // The first line names the exact build (e.g. `Debian clang version 19.1.7 (3+b1)`).
        let identity = CompilerIdentity { name: "clang-hip".into(), version: first.clone(), build: first };
        let compiler = ClangHipCompiler { clang, major, identity };
        compiler.probe()?;
        Ok(compiler)
    }

    /// The clang binary in use.
    pub fn clang_path(&self) -> &Path {
        &self.clang
    }

    /// Its major version.
    pub fn major_version(&self) -> u32 {
        self.major
    }

    fn probe(&self) -> Result<()> {
        let target = Target::Gfx942;
        let probe_err = |detail: String| {
            let lld = if detail.contains("lld") {
                " (the linker `ld.lld` is missing or broken: install the lld package matching this clang, e.g. `lld-19` for clang-19)"
            } else {
                ""
            };
            Error::Other(format!(
                "{} cannot build a {target} code object{lld}; {INSTALL_HINT}\n{detail}",
                self.clang.display()
            ))
        };
        let dir = scratch_dir()?;
        let src = dir.path().join("probe.cu");
        write_file(&src, PROBE_SOURCE)?;
        let out = dir.path().join("probe.hsaco");
        let output = self
            .run(target, dir.path(), &dir.path().join("include"), &src, &out)
            .map_err(|e| probe_err(e.to_string()))?;
        let log = combined_log(&output);
        if !output.status.success() {
            return Err(probe_err(format!("--- clang log ---\n{log}")));
        }
        let bytes = std::fs::read(&out).map_err(|e| probe_err(format!("no output: {e}\n{log}")))?;
        check_code_object(&bytes, target, PROBE_SYMBOL).map_err(probe_err)?;
        Ok(())
    }

    /// Runs clang on `src` with the options of `target`, writing `out`.
    fn run(&self, target: Target, cwd: &Path, include: &Path, src: &Path, out: &Path) -> std::io::Result<Output> {
        let mut cmd = Command::new(&self.clang);
        cmd.args(self.options(target))
            .arg(format!("-I{}", include.display()))
            .arg("-o")
            .arg(out)
            .arg(src)
            .current_dir(cwd);
        for var in SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        run_capture(&mut cmd)
    }

    fn command_line(&self, target: Target, include: &Path, src: &Path, out: &Path) -> String {
        let mut parts = vec![self.clang.display().to_string()];
        parts.extend(self.options(target));
        parts.push(format!("-I{}", include.display()));
        parts.push("-o".into());
        parts.push(out.display().to_string());
        parts.push(src.display().to_string());
        parts.join(" ")
    }

    /// Writes the failing source (and the headers it includes) to a stable place and
    /// builds the [`Error::Compile`] for it.
    fn compile_error(&self, kernel: &RenderedKernel, tmp: &Path, log: &str) -> Error {
        // Same layout as the NVRTC compiler: `<temp>/nsa-failed/<id>/{<source>, include/…}`.
        let dump = std::env::temp_dir().join("nsa-failed").join(&kernel.id);
        let src = dump.join(&kernel.source_name);
        let include = dump.join("include");
        let out = dump.join(format!("{}.hsaco", kernel.id));
        let dumped = write_tree(&include, &src, &kernel.source);
        let options = self.command_line(kernel.spec.target, &include, &src, &out);
        let (source_path, log) = match dumped {
            Ok(()) => (src.display().to_string(), relocate_log(log, tmp, &include, &kernel.source_name, &src)),
            Err(e) => (format!("<could not dump the source: {e}>"), log.to_string()),
        };
        Error::Compile {
            id: kernel.id.clone(),
            compiler: format!("{} {}", self.identity.name, self.identity.version),
            options,
            source_path,
            log,
        }
    }
}

impl Compiler for ClangHipCompiler {
    fn identity(&self) -> &CompilerIdentity {
        &self.identity
    }

    /// Everything but the per-compile paths (`-I<tmp>/include -o <out> <src>`), which
    /// are appended by [`compile`](Compiler::compile) and never change the output.
    fn options(&self, target: Target) -> Vec<String> {
        [
            "-x",
            "hip",
            &format!("--offload-arch={}", target.arch()),
            // Device code only, as a plain linked code object (ET_DYN, via ld.lld) rather
            // than a clang offload bundle; no `-c`: hipModuleLoad wants the linked object.
            "--cuda-device-only",
            "--no-gpu-bundle-output",
            // Hermetic: no ROCm device libs, no HIP wrapper headers, no system headers,
            // no clang config files. Only our embedded headers are reachable.
            "-nogpulib",
            "-nogpuinc",
            "-nostdinc",
            "--no-default-config",
            // The per-TU `__hip_cuid_<hash of the path>` symbol would make the image
            // depend on the temp dir; this makes it a fixed name.
            "-fuse-cuid=none",
            // Pinned rather than clang's default, which differs between versions; v5 is
            // loaded by every ROCm that supports gfx942.
            "-mcode-object-version=5",
            "-O3",
            "-std=c++17",
            // VGPR/SGPR/LDS/scratch per kernel on stderr, parsed into ResourceUsage.
            "-Rpass-analysis=kernel-resource-usage",
        ]
        .into_iter()
        .map(String::from)
        .collect()
    }

    fn compile(&self, kernel: &RenderedKernel) -> Result<CompiledImage> {
        let target = kernel.spec.target;
        if target.vendor() != Vendor::Amd {
            return Err(Error::Other(format!(
                "clang-hip compiles AMD targets only, but `{}` targets {target}",
                kernel.id
            )));
        }
        let dir = scratch_dir()?;
        let include = dir.path().join("include");
        let src = dir.path().join(&kernel.source_name);
        write_tree(&include, &src, &kernel.source)?;
        let out = dir.path().join(format!("{}.hsaco", kernel.id));
        let output = self
            .run(target, dir.path(), &include, &src, &out)
            .map_err(|e| Error::Other(format!("cannot run {}: {e}", self.clang.display())))?;
        let raw_log = combined_log(&output);
        if !output.status.success() {
            return Err(self.compile_error(kernel, dir.path(), &raw_log));
        }
        let bytes = match std::fs::read(&out) {
            Ok(b) => b,
            Err(e) => {
                let log = format!("clang exited 0 but {} is unreadable: {e}\n{raw_log}", out.display());
                return Err(self.compile_error(kernel, dir.path(), &log));
            }
        };
        if let Err(why) = check_code_object(&bytes, target, &kernel.symbol) {
            let log = format!("clang exited 0 but its output is not usable: {why}\n{raw_log}");
            return Err(self.compile_error(kernel, dir.path(), &log));
        }
        // Paths in the kept log are relative to the compile dir, so equal inputs give equal logs.
        let log = relocate_log(
            &raw_log,
            dir.path(),
            Path::new("include"),
            &kernel.source_name,
            Path::new(&kernel.source_name),
        );
        let resources = parse_resource_usage(&log, &kernel.symbol);
        Ok(CompiledImage { kind: OutputKind::HsaCodeObject, bytes, log, resources })
    }
}

/// What [`inspect_code_object`] reads from an ELF64 code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeObjectInfo {
    /// `e_type` (3 = `ET_DYN`, a linked code object).
    pub elf_type: u16,
    /// `e_machine` ([`EM_AMDGPU`] for AMD GPUs).
    pub machine: u16,
    /// `e_flags` (the low byte is the AMDGPU mach, e.g. [`EF_AMDGPU_MACH_GFX942`]).
    pub flags: u32,
    /// Defined, non-local, non-hidden entries of `.dynsym`.
    pub exports: Vec<ExportedSymbol>,
}

/// One exported dynamic symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedSymbol {
    pub name: String,
    /// `STT_*` (2 = function, 1 = object).
    pub kind: u8,
}

impl CodeObjectInfo {
    /// The AMDGPU mach (`e_flags & EF_AMDGPU_MACH`).
    pub fn mach(&self) -> u32 {
        self.flags & EF_AMDGPU_MACH
    }

    /// Whether `symbol` is exported as a function together with its kernel descriptor
    /// `symbol.kd`, i.e. `hipModuleGetFunction(symbol)` will find it.
    pub fn exports_kernel(&self, symbol: &str) -> bool {
        let has = |name: &str, kind: u8| self.exports.iter().any(|s| s.name == name && s.kind == kind);
        has(symbol, 2) && has(&format!("{symbol}.kd"), 1)
    }
}

/// Parses the ELF header and `.dynsym` of a little-endian ELF64 file.
pub fn inspect_code_object(bytes: &[u8]) -> std::result::Result<CodeObjectInfo, String> {
    let rd = |off: usize, n: usize| -> std::result::Result<u64, String> {
        let s = bytes
            .get(off..off.checked_add(n).ok_or("offset overflow")?)
            .ok_or_else(|| format!("truncated ELF: need bytes {off}..{} of {}", off + n, bytes.len()))?;
        Ok(s.iter().rev().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    };
    let us = |v: u64| usize::try_from(v).map_err(|_| "ELF offset does not fit usize".to_string());
    if bytes.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err(format!("not an ELF file ({} bytes)", bytes.len()));
    }
    if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
        return Err("not a little-endian ELF64 file".into());
    }
    let elf_type = rd(16, 2)? as u16;
    let machine = rd(18, 2)? as u16;
    let flags = rd(48, 4)? as u32;
    let shoff = us(rd(40, 8)?)?;
    let shentsize = us(rd(58, 2)?)?;
    let shnum = us(rd(60, 2)?)?;
    if shentsize < 64 && shnum > 0 {
        return Err(format!("bad section header size {shentsize}"));
    }
    let section = |i: usize| -> std::result::Result<(u32, usize, usize, usize, usize), String> {
        let base = shoff + i * shentsize;
        Ok((
            rd(base + 4, 4)? as u32, // sh_type
            us(rd(base + 24, 8)?)?,  // sh_offset
            us(rd(base + 32, 8)?)?,  // sh_size
            us(rd(base + 40, 4)?)?,  // sh_link
            us(rd(base + 56, 8)?)?,  // sh_entsize
        ))
    };
    let mut exports = Vec::new();
    for i in 0..shnum {
        let (ty, off, size, link, entsize) = section(i)?;
        if ty != 11 {
            continue; // SHT_DYNSYM
        }
        let (_, str_off, str_size, _, _) = section(link)?;
        let strtab = bytes.get(str_off..str_off + str_size).ok_or("truncated .dynstr")?;
        let entsize = if entsize == 0 { 24 } else { entsize };
        for k in 0..size / entsize {
            let base = off + k * entsize;
            let name_off = us(rd(base, 4)?)?;
            let info = rd(base + 4, 1)? as u8;
            let other = rd(base + 5, 1)? as u8;
            let shndx = rd(base + 6, 2)? as u16;
            let (bind, kind, vis) = (info >> 4, info & 0xf, other & 3);
            // Defined, GLOBAL or WEAK, not HIDDEN/INTERNAL.
            if shndx == 0 || !(bind == 1 || bind == 2) || vis == 1 || vis == 2 {
                continue;
            }
            let name = strtab
                .get(name_off..)
                .and_then(|s| s.split(|&b| b == 0).next())
                .ok_or("symbol name outside .dynstr")?;
            exports.push(ExportedSymbol { name: String::from_utf8_lossy(name).into_owned(), kind });
        }
    }
    Ok(CodeObjectInfo { elf_type, machine, flags, exports })
}

/// Checks that `bytes` is a linked AMDGPU code object for `target` exporting `symbol`.
pub fn check_code_object(bytes: &[u8], target: Target, symbol: &str) -> std::result::Result<CodeObjectInfo, String> {
    let info = inspect_code_object(bytes)?;
    if info.machine != EM_AMDGPU {
        return Err(format!("ELF machine is {} (expected EM_AMDGPU = {EM_AMDGPU})", info.machine));
    }
    if info.elf_type != ET_DYN {
        return Err(format!(
            "ELF type is {} (expected ET_DYN = 3, a linked code object; an offload bundle or relocatable object cannot be loaded)",
            info.elf_type
        ));
    }
    let want = match target {
        Target::Gfx942 => EF_AMDGPU_MACH_GFX942,
        other => return Err(format!("{other} is not an AMDGPU target")),
    };
    if info.mach() != want {
        return Err(format!("AMDGPU mach is {:#x} (expected {want:#x} for {target})", info.mach()));
    }
    if !info.exports_kernel(symbol) {
        let names: Vec<&str> = info.exports.iter().map(|s| s.name.as_str()).collect();
        return Err(format!("kernel `{symbol}` (function + `{symbol}.kd`) is not exported; exports: {names:?}"));
    }
    Ok(info)
}

/// Reads the `-Rpass-analysis=kernel-resource-usage` remarks of `symbol`:
/// registers = VGPRs (arch VGPRs; AGPRs are reported apart and not added),
/// smem = LDS bytes per block, spills = scratch bytes per lane (clang reports one
/// scratch figure; it stands for both the store and the load side).
pub fn parse_resource_usage(log: &str, symbol: &str) -> ResourceUsage {
    let mut usage = ResourceUsage::default();
    let mut current = false;
    for line in log.lines() {
        let Some(pos) = line.find("remark: ") else {
            continue;
        };
        let mut text = &line[pos + "remark: ".len()..];
        if let Some(end) = text.rfind(" [-R") {
            text = &text[..end];
        }
        let text = text.trim();
        if let Some(name) = text.strip_prefix("Function Name: ") {
            current = name.trim() == symbol;
            continue;
        }
        if !current {
            continue;
        }
        let value = |prefix: &str| text.strip_prefix(prefix).and_then(|v| v.trim().parse::<u32>().ok());
        if let Some(v) = value("VGPRs: ") {
            usage.registers = Some(v);
        } else if let Some(v) = value("LDS Size [bytes/block]: ") {
            usage.smem_bytes = Some(v);
        } else if let Some(v) = value("ScratchSize [bytes/lane]: ") {
            usage.spill_store_bytes = Some(v);
            usage.spill_load_bytes = Some(v);
        }
    }
    usage
}

/// The major version from a `clang --version` first line (`Debian clang version 19.1.7 (…)`,
/// `AMD clang version 17.0.0 (…)`, `clang version 18.1.3`).
fn parse_clang_major(first_line: &str) -> Option<u32> {
    let rest = &first_line[first_line.find("clang version ")? + "clang version ".len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// `p` itself if it names a file (has a directory part), else its first match on `PATH`.
fn resolve(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 || p.is_absolute() {
        return is_executable(p).then(|| p.to_path_buf());
    }
    let path: OsString = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(p)).find(|c| is_executable(c))
}

fn is_executable(p: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(p) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        meta.is_file()
    }
}

fn run_capture(cmd: &mut Command) -> std::io::Result<Output> {
    cmd.stdin(std::process::Stdio::null()).output()
}

fn combined_log(out: &Output) -> String {
    let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.trim().is_empty() {
        let _ = write!(log, "{}{stdout}", if log.is_empty() { "" } else { "\n" });
    }
    if !out.status.success() && log.trim().is_empty() {
        log = format!("clang exited with {} and printed nothing", out.status);
    }
    log
}

/// Rewrites the temp-dir paths in a clang log: headers to `include`, the source to `src`.
fn relocate_log(log: &str, tmp: &Path, include: &Path, source_name: &str, src: &Path) -> String {
    let tmp = tmp.display().to_string();
    log.replace(&format!("{tmp}/include"), &include.display().to_string())
        .replace(&format!("{tmp}/{source_name}"), &src.display().to_string())
}

fn scratch_dir() -> Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("nsa-hip-").tempdir().map_err(Error::io(std::env::temp_dir()))
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(Error::io(parent))?;
    }
    std::fs::write(path, text).map_err(Error::io(path))
}

/// Writes every embedded header under `include` and the source at `src`.
fn write_tree(include: &Path, src: &Path, source: &str) -> Result<()> {
    for (name, text) in HEADERS {
        write_file(&include.join(name), text)?;
    }
    write_file(src, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clang_major_from_version_lines() {
        assert_eq!(parse_clang_major("Debian clang version 19.1.7 (3~deb12u1)"), Some(19));
        assert_eq!(
            parse_clang_major("AMD clang version 17.0.0 (https://github.com/RadeonOpenCompute/llvm-project roc-6.0.0)"),
            Some(17)
        );
        assert_eq!(parse_clang_major("clang version 20.0.0git"), Some(20));
        assert_eq!(parse_clang_major("gcc (Debian 12.2.0-14) 12.2.0"), None);
    }

    #[test]
    fn resource_remarks_of_the_right_kernel() {
        let log = "\
k.cu:8:1: remark: Function Name: other [-Rpass-analysis=kernel-resource-usage]
k.cu:8:1: remark:     VGPRs: 99 [-Rpass-analysis=kernel-resource-usage]
k.cu:8:1: remark: Function Name: nsa_x [-Rpass-analysis=kernel-resource-usage]
k.cu:8:1: remark:     SGPRs: 24 [-Rpass-analysis=kernel-resource-usage]
k.cu:8:1: remark:     VGPRs: 39 [-Rpass-analysis=kernel-resource-usage]
k.cu:8:1: remark:     AGPRs: 0 [-Rpass-analysis=kernel-resource-usage]
k.cu:8:1: remark:     ScratchSize [bytes/lane]: 16 [-Rpass-analysis=kernel-resource-usage]
k.cu:8:1: remark:     VGPRs Spill: 4 [-Rpass-analysis=kernel-resource-usage]
k.cu:8:1: remark:     LDS Size [bytes/block]: 2048 [-Rpass-analysis=kernel-resource-usage]
";
        let u = parse_resource_usage(log, "nsa_x");
        assert_eq!(u.registers, Some(39));
        assert_eq!(u.smem_bytes, Some(2048));
        assert_eq!(u.spill_store_bytes, Some(16));
        assert_eq!(u.spill_load_bytes, Some(16));
        assert_eq!(parse_resource_usage(log, "missing"), ResourceUsage::default());
    }

    #[test]
    fn inspect_rejects_non_elf() {
        assert!(inspect_code_object(b"").is_err());
        assert!(inspect_code_object(b"__CLANG_OFFLOAD_BUNDLE____").is_err());
    }
}
