//! The NVRTC entry points nsa calls, resolved from one library handle.
//!
//! nsa resolves these itself rather than through cudarc's `nvrtc` module: cudarc
//! looks the library up by soname on its own and panics on a missing library or
//! symbol, where a bad install must be an error that names the file.

use libloading::os::unix::{Library, Symbol, RTLD_GLOBAL, RTLD_LOCAL, RTLD_NOW};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;

/// An NVRTC program handle.
pub type Program = *mut c_void;
/// `nvrtcResult`; 0 is success.
pub type Status = c_int;

/// Every symbol [`NvrtcApi`] resolves; a library lacking one is refused before it is loaded.
pub const SYMBOLS: [&str; 11] = [
    "nvrtcVersion",
    "nvrtcGetErrorString",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
];

type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status;
type ErrorStringFn = unsafe extern "C" fn(Status) -> *const c_char;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> Status;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> Status;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> Status;
type FillFn = unsafe extern "C" fn(Program, *mut c_char) -> Status;

/// The resolved entry points; the libraries stay loaded for the life of the process.
#[derive(Debug)]
pub struct NvrtcApi {
    pub version: VersionFn,
    error_string: ErrorStringFn,
    pub create_program: CreateFn,
    pub compile_program: CompileFn,
    pub destroy_program: DestroyFn,
    pub program_log_size: SizeFn,
    pub program_log: FillFn,
    pub cubin_size: SizeFn,
    pub cubin: FillFn,
    pub ptx_size: SizeFn,
    pub ptx: FillFn,
}

impl NvrtcApi {
    /// Loads `builtins` (globally, so that `library` finds it by soname when it
    /// compiles) and `library`, and resolves [`SYMBOLS`].
    ///
    /// # Safety
    /// Loading runs the libraries' initialisers: both must be NVRTC libraries that
    /// were checked (whole ELF files for this machine exporting [`SYMBOLS`]).
    pub unsafe fn load(library: &Path, builtins: &Path) -> Result<NvrtcApi, String> {
        let open = |path: &Path, flags| {
            // SAFETY: forwarded from the caller.
            unsafe { Library::open(Some(path), flags) }
                .map_err(|e| format!("{}: cannot be loaded: {e}", path.display()))
        };
        let builtins_lib = open(builtins, RTLD_NOW | RTLD_GLOBAL)?;
        let lib = open(library, RTLD_NOW | RTLD_LOCAL)?;
        fn get<T: Copy>(lib: &Library, path: &Path, name: &str) -> Result<T, String> {
            let sym = format!("{name}\0");
            // SAFETY: `T` is the documented C signature of `name` in the NVRTC API.
            let f: Symbol<T> = unsafe { lib.get(sym.as_bytes()) }
                .map_err(|e| format!("{}: does not export {name}: {e}", path.display()))?;
            Ok(*f)
        }
        let api = NvrtcApi {
            version: get(&lib, library, "nvrtcVersion")?,
            error_string: get(&lib, library, "nvrtcGetErrorString")?,
            create_program: get(&lib, library, "nvrtcCreateProgram")?,
            compile_program: get(&lib, library, "nvrtcCompileProgram")?,
            destroy_program: get(&lib, library, "nvrtcDestroyProgram")?,
            program_log_size: get(&lib, library, "nvrtcGetProgramLogSize")?,
            program_log: get(&lib, library, "nvrtcGetProgramLog")?,
            cubin_size: get(&lib, library, "nvrtcGetCUBINSize")?,
            cubin: get(&lib, library, "nvrtcGetCUBIN")?,
            ptx_size: get(&lib, library, "nvrtcGetPTXSize")?,
            ptx: get(&lib, library, "nvrtcGetPTX")?,
        };
        // The function pointers above borrow from these for the life of the process.
        std::mem::forget(builtins_lib);
        std::mem::forget(lib);
        Ok(api)
    }

    /// `nvrtcVersion()`.
    pub fn runtime_version(&self) -> Result<(i32, i32), String> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: nvrtcVersion only writes the two ints.
        let rc = unsafe { (self.version)(&mut major, &mut minor) };
        if rc != 0 {
            return Err(format!("nvrtcVersion failed: {}", self.describe(rc)));
        }
        Ok((major, minor))
    }

    /// `nvrtcGetErrorString(rc)` with the number.
    pub fn describe(&self, rc: Status) -> String {
        // SAFETY: NVRTC returns a static string (or null for unknown codes).
        let text = unsafe { (self.error_string)(rc) };
        if text.is_null() {
            return format!("NVRTC error {rc}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        format!("{} ({rc})", unsafe { CStr::from_ptr(text) }.to_string_lossy())
    }

    /// `Ok` for status 0, else the described error prefixed with `call`.
    pub fn check(&self, call: &str, rc: Status) -> Result<(), String> {
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("{call}: {}", self.describe(rc)))
        }
    }

    /// Reads one of the program's size-then-fill outputs (log, CUBIN, PTX).
    ///
    /// # Safety
    /// `prog` must be a live program for which `size`/`fill` may be called.
    pub unsafe fn read_output(&self, prog: Program, what: &str, size: SizeFn, fill: FillFn) -> Result<Vec<u8>, String> {
        let mut len = 0usize;
        // SAFETY: forwarded from the caller; the buffer has exactly `len` bytes.
        unsafe {
            self.check(what, size(prog, &mut len))?;
            let mut buf = vec![0u8; len];
            self.check(what, fill(prog, buf.as_mut_ptr().cast()))?;
            Ok(buf)
        }
    }
}
