//! NVRTC → CUBIN for the exact arch, through the entry points of
//! [`nvrtc_api`](super::nvrtc_api), passing our headers in memory.

use super::nvrtc_api::{NvrtcApi, Program};
use super::nvrtc_lib::{self, LocateError, NvrtcFiles};
use super::{CompiledImage, Compiler, CompilerIdentity, ResourceUsage};
use crate::{Error, Result};
use nsa_kernels::{render::HEADERS, OutputKind, RenderedKernel, Target, Toolchain};
use std::ffi::{c_char, CString};
use std::path::PathBuf;

/// Compiles CUDA sources with the NVRTC that [`nvrtc_lib::locate`] finds. Creating
/// one only locates and checks the library (a few KB read); it is loaded on the
/// first compile, so a process whose kernels all come from the cache never loads it.
#[derive(Debug)]
pub struct NvrtcCompiler {
    identity: CompilerIdentity,
    /// The install, or why none was found (the error every compile then returns).
    files: std::result::Result<NvrtcFiles, String>,
}

impl NvrtcCompiler {
    /// Locates NVRTC from the environment. A wrong `NSA_NVRTC_PATH` is an error;
    /// no NVRTC anywhere is not (a warm cache needs none): the identity is then
    /// unknown and compiling returns [`Error::NvrtcNotFound`] with every place tried.
    pub fn new() -> Result<Self> {
        match nvrtc_lib::locate() {
            Ok(files) => Ok(Self::from_files(files.clone())),
            Err(LocateError::Explicit(msg)) => Err(Error::NvrtcNotFound(msg)),
            Err(LocateError::NotFound(msg)) => {
                Ok(NvrtcCompiler { identity: CompilerIdentity::unknown("nvrtc"), files: Err(msg) })
            }
        }
    }

    /// A compiler over an install located by the caller.
    pub fn from_files(files: NvrtcFiles) -> Self {
        let (major, minor) = files.version;
        NvrtcCompiler {
            identity: CompilerIdentity {
                name: "nvrtc".into(),
                version: format!("{major}.{minor}"),
                build: files.build.clone(),
            },
            files: Ok(files),
        }
    }

    /// The located install, or why there is none.
    pub fn files(&self) -> std::result::Result<&NvrtcFiles, &str> {
        self.files.as_ref().map_err(String::as_str)
    }

    /// The loaded library (verified and loaded on the first call).
    fn api(&self) -> Result<&'static NvrtcApi> {
        let files = self.files.as_ref().map_err(|m| Error::NvrtcNotFound(m.clone()))?;
        files.load().map_err(Error::NvrtcNotFound)
    }

    /// The PTX of `kernel` (for `nsa inspect --ptx`; launches always use the CUBIN).
    pub fn ptx(&self, kernel: &RenderedKernel) -> Result<String> {
        let options = self.options(kernel.spec.target);
        let (ptx, _) = self.compile_program(kernel, &options, Artifact::Ptx)?;
        Ok(String::from_utf8_lossy(&ptx).trim_end_matches('\0').to_string())
    }

    fn compile_program(
        &self,
        kernel: &RenderedKernel,
        options: &[String],
        artifact: Artifact,
    ) -> Result<(Vec<u8>, String)> {
        let api = self.api()?;
        let fail = |log: String| compile_error(kernel, &self.identity, options, log);
        let src = CString::new(kernel.source.as_str()).map_err(|e| fail(format!("source holds a NUL byte: {e}")))?;
        let name = CString::new(kernel.source_name.as_str()).map_err(|e| fail(e.to_string()))?;
        let header_texts: Vec<CString> = HEADERS.iter().map(|(_, t)| CString::new(*t).expect("no NUL")).collect();
        let header_names: Vec<CString> = HEADERS.iter().map(|(n, _)| CString::new(*n).expect("no NUL")).collect();
        let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();
        let option_texts: Vec<CString> =
            options.iter().map(|o| CString::new(o.as_str()).map_err(|e| fail(e.to_string()))).collect::<Result<_>>()?;
        let option_ptrs: Vec<*const c_char> = option_texts.iter().map(|c| c.as_ptr()).collect();

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer refers to a NUL-terminated string that outlives `prog`
        // (destroyed below before they drop); the header arrays have equal length.
        let created = unsafe {
            (api.create_program)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                HEADERS.len() as i32,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
        };
        api.check("nvrtcCreateProgram", created).map_err(fail)?;
        // SAFETY: `prog` was created above and is destroyed exactly once, here; the
        // option pointers outlive the call.
        unsafe {
            let compiled = (api.compile_program)(prog, option_ptrs.len() as i32, option_ptrs.as_ptr());
            let log = program_log(api, prog);
            let out = match api.check("nvrtcCompileProgram", compiled) {
                Ok(()) => match artifact {
                    Artifact::Cubin => api.read_output(prog, "nvrtcGetCUBIN", api.cubin_size, api.cubin),
                    Artifact::Ptx => api.read_output(prog, "nvrtcGetPTX", api.ptx_size, api.ptx),
                }
                .map(|bytes| (bytes, log))
                .map_err(fail),
                Err(e) => Err(fail(format!("{e}\n{log}"))),
            };
            let _ = (api.destroy_program)(&mut prog);
            out
        }
    }
}

#[derive(Clone, Copy)]
enum Artifact {
    Cubin,
    Ptx,
}

impl Compiler for NvrtcCompiler {
    fn identity(&self) -> &CompilerIdentity {
        &self.identity
    }

    fn identity_known(&self) -> bool {
        self.files.is_ok()
    }

    fn options(&self, target: Target) -> Vec<String> {
        vec![
            format!("--gpu-architecture={}", target.arch()),
            "--std=c++17".into(),
            // ptxas -v: registers, smem and spills land in the program log.
            "--ptxas-options=--verbose".into(),
            "-DNSA_NVRTC=1".into(),
        ]
    }

    fn compile(&self, kernel: &RenderedKernel) -> Result<CompiledImage> {
        let target = kernel.spec.target;
        if target.toolchain() != Toolchain::Nvrtc {
            return Err(Error::Other(format!(
                "`{}` targets {target}, which NVRTC cannot build; use the HIP compiler",
                kernel.id
            )));
        }
        let options = self.options(target);
        let (bytes, log) = self.compile_program(kernel, &options, Artifact::Cubin)?;
        let resources = parse_ptxas_log(&log, &kernel.symbol);
        Ok(CompiledImage { kind: OutputKind::Cubin, bytes, log, resources })
    }
}

/// # Safety
/// `prog` must be a live program.
unsafe fn program_log(api: &NvrtcApi, prog: Program) -> String {
    // SAFETY: forwarded from the caller.
    match unsafe { api.read_output(prog, "nvrtcGetProgramLog", api.program_log_size, api.program_log) } {
        Ok(bytes) => {
            let bytes: Vec<u8> = bytes.into_iter().take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
        Err(e) => format!("(no log: {e})"),
    }
}

fn compile_error(kernel: &RenderedKernel, id: &CompilerIdentity, options: &[String], log: String) -> Error {
    let source_path = dump_failed_source(kernel);
    Error::Compile {
        id: kernel.id.clone(),
        compiler: format!("{} {}", id.name, id.version),
        options: options.join(" "),
        source_path,
        log,
    }
}

/// Writes the failing source (and the headers it includes) where a human can open it.
fn dump_failed_source(kernel: &RenderedKernel) -> String {
    let dir: PathBuf = std::env::temp_dir().join("nsa-failed").join(&kernel.id);
    let write = || -> std::io::Result<PathBuf> {
        for (name, text) in HEADERS {
            let p = dir.join("include").join(name);
            std::fs::create_dir_all(p.parent().expect("header paths have a parent"))?;
            std::fs::write(p, text)?;
        }
        let p = dir.join(&kernel.source_name);
        std::fs::write(&p, &kernel.source)?;
        Ok(p)
    };
    match write() {
        Ok(p) => p.display().to_string(),
        Err(e) => format!("(could not dump the source to {}: {e})", dir.display()),
    }
}

/// Reads ptxas `-v` lines: registers and smem ("Used N registers, ... N bytes smem")
/// of the entry function `symbol`, and the spills of every function in the image
/// (see [`function_spills`]).
pub fn parse_ptxas_log(log: &str, symbol: &str) -> ResourceUsage {
    let mut usage = ResourceUsage::default();
    let mut in_symbol = false;
    for line in log.lines() {
        if line.contains("Compiling entry function") || line.contains("Function properties for") {
            in_symbol = line.contains(symbol);
        }
        if !in_symbol {
            continue;
        }
        usage.registers = usage.registers.or_else(|| number_before(line, " registers"));
        usage.smem_bytes = usage.smem_bytes.or_else(|| number_before(line, " bytes smem"));
    }
    // ptxas leaves out "bytes smem" for kernels that use none.
    if usage.registers.is_some() && usage.smem_bytes.is_none() {
        usage.smem_bytes = Some(0);
    }
    let spills = function_spills(log);
    if !spills.is_empty() {
        usage.spill_store_bytes = Some(spills.iter().map(|f| f.store_bytes).sum());
        usage.spill_load_bytes = Some(spills.iter().map(|f| f.load_bytes).sum());
    }
    usage
}

/// One function's spills as ptxas `-v` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSpills {
    /// The (mangled) function name.
    pub function: String,
    pub store_bytes: u32,
    pub load_bytes: u32,
}

/// The spills ("N bytes spill stores, N bytes spill loads") of every function in
/// the image, in log order: the entry and each callee ptxas keeps apart
/// (`__noinline__`), whose spills the entry's line leaves out.
pub fn function_spills(log: &str) -> Vec<FunctionSpills> {
    let mut out = Vec::new();
    let mut function = None;
    for line in log.lines() {
        if let Some((_, name)) = line.split_once("Function properties for ") {
            function = Some(name.trim().to_string());
        }
        let (Some(store), Some(load)) =
            (number_before(line, " bytes spill stores"), number_before(line, " bytes spill loads"))
        else {
            continue;
        };
        let function = function.take().unwrap_or_default();
        out.push(FunctionSpills { function, store_bytes: store, load_bytes: load });
    }
    out
}

fn number_before(line: &str, suffix: &str) -> Option<u32> {
    let end = line.find(suffix)?;
    let head = &line[..end];
    let start = head.rfind(|c: char| !c.is_ascii_digit()).map_or(0, |i| i + 1);
    head[start..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_verbose_lines() {
        let log = "ptxas info    : Compiling entry function 'nsa_x' for 'sm_90a'\n\
                   ptxas info    : Function properties for nsa_x\n\
                   \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 0 barriers, 1024 bytes smem, 400 bytes cmem[0]\n\
                   ptxas info    : Compiling entry function 'other' for 'sm_90a'\n\
                   ptxas info    : Used 99 registers";
        let u = parse_ptxas_log(log, "nsa_x");
        assert_eq!(u.registers, Some(40));
        assert_eq!(u.smem_bytes, Some(1024));
        assert_eq!(u.spill_store_bytes, Some(4));
        assert_eq!(u.spill_load_bytes, Some(12));
    }

    #[test]
    fn counts_the_spills_of_non_inlined_callees() {
        let log = "ptxas info    : Compiling entry function 'nsa_x' for 'sm_90a'\n\
                   ptxas info    : Function properties for nsa_x\n\
                   \x20   104 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 64 registers, used 1 barriers, 104 bytes cumulative stack size\n\
                   ptxas info    : Function properties for _ZN3nsa4topk13histogram_rowEv\n\
                   \x20   0 bytes stack frame, 16 bytes spill stores, 64 bytes spill loads";
        let u = parse_ptxas_log(log, "nsa_x");
        assert_eq!(u.registers, Some(64));
        assert_eq!(u.spill_store_bytes, Some(16));
        assert_eq!(u.spill_load_bytes, Some(64));
        let per_function = function_spills(log);
        assert_eq!(per_function.len(), 2);
        assert_eq!(per_function[0], FunctionSpills { function: "nsa_x".into(), store_bytes: 0, load_bytes: 0 });
        assert_eq!(per_function[1].function, "_ZN3nsa4topk13histogram_rowEv");
        assert_eq!((per_function[1].store_bytes, per_function[1].load_bytes), (16, 64));
    }
}
