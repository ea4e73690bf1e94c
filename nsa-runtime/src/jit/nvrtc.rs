//! NVRTC → CUBIN for the exact arch. cudarc's safe API stops at PTX, so this goes
//! one level down (`nvrtcGetCUBIN`) and passes our headers in memory.

use super::{nvrtc_lib, CompiledImage, Compiler, CompilerIdentity, ResourceUsage};
use crate::{Error, Result};
use cudarc::nvrtc::{result, sys};
use nsa_kernels::{render::HEADERS, OutputKind, RenderedKernel, Target, Toolchain};
use std::ffi::{c_char, CString};
use std::path::PathBuf;

/// Compiles CUDA sources with the NVRTC found by [`nvrtc_lib::load`].
#[derive(Debug)]
pub struct NvrtcCompiler {
    identity: CompilerIdentity,
    library: &'static nvrtc_lib::NvrtcLibrary,
}

impl NvrtcCompiler {
    /// Finds and loads NVRTC (never panics: a missing library is an error that lists
    /// every place tried and how to install it).
    pub fn new() -> Result<Self> {
        let library = nvrtc_lib::load().map_err(Error::NvrtcNotFound)?;
        let (major, minor) = library.version;
        Ok(NvrtcCompiler {
            identity: CompilerIdentity { name: "nvrtc".into(), version: format!("{major}.{minor}") },
            library,
        })
    }

    pub fn library(&self) -> &nvrtc_lib::NvrtcLibrary {
        self.library
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
        let fail = |log: String| compile_error(kernel, &self.identity, options, log);
        let src = CString::new(kernel.source.as_str()).map_err(|e| fail(format!("source holds a NUL byte: {e}")))?;
        let name = CString::new(kernel.source_name.as_str()).map_err(|e| fail(e.to_string()))?;
        let header_texts: Vec<CString> = HEADERS.iter().map(|(_, t)| CString::new(*t).expect("no NUL")).collect();
        let header_names: Vec<CString> = HEADERS.iter().map(|(n, _)| CString::new(*n).expect("no NUL")).collect();
        let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|c| c.as_ptr()).collect();
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|c| c.as_ptr()).collect();

        let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer refers to a NUL-terminated string that outlives `prog`
        // (destroyed below before they drop); the header arrays have equal length.
        unsafe {
            sys::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                HEADERS.len() as i32,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
            .result()
            .map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?;
        }
        // SAFETY: `prog` was created above and is destroyed exactly once, here.
        let outcome = unsafe {
            let compiled = result::compile_program(prog, options);
            let log = program_log(prog);
            let out = match compiled {
                Ok(()) => match artifact {
                    Artifact::Cubin => get_cubin(prog).map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}"))),
                    Artifact::Ptx => result::get_ptx(prog)
                        .map(|p| p.iter().map(|&c| c as u8).collect())
                        .map_err(|e| fail(format!("nvrtcGetPTX: {e:?}"))),
                }
                .map(|bytes| (bytes, log)),
                Err(e) => Err(fail(format!("{e:?}\n{log}"))),
            };
            let _ = result::destroy_program(prog);
            out
        };
        outcome
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
unsafe fn program_log(prog: sys::nvrtcProgram) -> String {
    // SAFETY: forwarded from the caller.
    match unsafe { result::get_program_log(prog) } {
        Ok(chars) => {
            let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// # Safety
/// `prog` must be a live, successfully compiled program.
unsafe fn get_cubin(prog: sys::nvrtcProgram) -> std::result::Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: forwarded from the caller; the buffer has exactly `size` bytes.
    unsafe {
        sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
        let mut buf = vec![0u8; size];
        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char).result()?;
        Ok(buf)
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
