//! Kernel cache tests with a fake compiler: keys, memory layer, disk layer,
//! self-healing, concurrency, `NSA_JIT=off` and unwritable roots.

use nsa_kernels::{render, KernelSpec, RenderedKernel, Target};
use nsa_runtime::cache::{
    dump_source, CacheConfig, CacheKey, CachedKernel, EntryMeta, JitPolicy, KernelCache, Origin, CACHE_SCHEMA,
    FAILED_DIR, FAILED_KEEP, IMAGE_FILE, LOCK_SUFFIX, META_FILE, QUARANTINE_DIR, QUARANTINE_KEEP, SOURCE_FILE,
};
use nsa_runtime::jit::{CompiledImage, Compiler, CompilerIdentity, ResourceUsage};
use nsa_runtime::{Error, Result};
use serde_json::json;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

type Hook = Box<dyn Fn(&RenderedKernel) + Send + Sync>;

/// A compiler that counts its calls, returns bytes derived from the source, and
/// can be told to fail, to sleep, or to run a hook mid-compile.
struct Fake {
    identity: CompilerIdentity,
    /// False: acts as a compiler that was not found (identity unknown).
    present: bool,
    options: Vec<String>,
    calls: AtomicUsize,
    fail_next: AtomicUsize,
    sleep: Duration,
    hook: Mutex<Option<Hook>>,
}

impl Fake {
    fn new() -> Fake {
        Fake::with("fake", "1.0", &["-O3", "--std=c++17"])
    }

    fn with(name: &str, version: &str, options: &[&str]) -> Fake {
        Fake {
            identity: CompilerIdentity {
                name: name.into(),
                version: version.into(),
                build: format!("{version} build"),
            },
            present: true,
            options: options.iter().map(|s| s.to_string()).collect(),
            calls: AtomicUsize::new(0),
            fail_next: AtomicUsize::new(0),
            sleep: Duration::ZERO,
            hook: Mutex::new(None),
        }
    }

    /// The same compiler, not found on this machine.
    fn absent(mut self) -> Fake {
        self.identity = CompilerIdentity::unknown(&self.identity.name);
        self.present = false;
        self
    }

    fn sleeping(mut self, d: Duration) -> Fake {
        self.sleep = d;
        self
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn image_for(kernel: &RenderedKernel) -> Vec<u8> {
        let mut bytes = b"FAKEIMG\0".to_vec();
        bytes.extend_from_slice(kernel.symbol.as_bytes());
        bytes.push(0);
        bytes.extend(kernel.source.bytes().rev());
        bytes
    }
}

impl Compiler for Fake {
    fn identity(&self) -> &CompilerIdentity {
        &self.identity
    }

    fn identity_known(&self) -> bool {
        self.present
    }

    fn options(&self, target: Target) -> Vec<String> {
        let mut o = self.options.clone();
        o.push(format!("--gpu-architecture={}", target.arch()));
        o
    }

    fn compile(&self, kernel: &RenderedKernel) -> Result<CompiledImage> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if !self.present {
            return Err(Error::NvrtcNotFound("fake compiler not found".into()));
        }
        if let Some(hook) = &*self.hook.lock().unwrap_or_else(|e| e.into_inner()) {
            hook(kernel);
        }
        if !self.sleep.is_zero() {
            std::thread::sleep(self.sleep);
        }
        let fail = self.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if fail {
            return Err(Error::Compile {
                id: kernel.id.clone(),
                compiler: self.identity.name.clone(),
                options: self.options(kernel.spec.target).join(" "),
                source_path: String::new(),
                log: "error: told to fail".into(),
            });
        }
        Ok(CompiledImage {
            kind: kernel.spec.target.output_kind(),
            bytes: Fake::image_for(kernel),
            log: format!("fake compiled {}", kernel.id),
            resources: ResourceUsage {
                registers: Some(40),
                smem_bytes: Some(0),
                spill_store_bytes: Some(0),
                spill_load_bytes: Some(0),
            },
        })
    }
}

fn specs() -> Vec<KernelSpec> {
    KernelSpec::all_for(Target::Sm90a)
}

fn spec() -> KernelSpec {
    specs()[0]
}

fn disk_cache(fake: &Arc<Fake>, root: &Path) -> KernelCache {
    KernelCache::new(fake.clone(), CacheConfig::at(root))
}

fn mem_cache(fake: &Arc<Fake>) -> KernelCache {
    KernelCache::new(fake.clone(), CacheConfig::memory_only())
}

fn key_of(cache: &KernelCache, spec: &KernelSpec) -> CacheKey {
    cache.key(&render(spec).unwrap())
}

fn entry_dir(cache: &KernelCache, spec: &KernelSpec) -> PathBuf {
    cache.entry_dir(&key_of(cache, spec)).unwrap()
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => vec![],
    };
    v.sort();
    v
}

fn assert_compiled(k: &CachedKernel) {
    assert!(matches!(k.origin, Origin::Compiled { .. }), "expected a compile, got {:?}", k.origin);
}

fn assert_from_disk(k: &CachedKernel) {
    assert!(matches!(k.origin, Origin::Disk { .. }), "expected a disk hit, got {:?}", k.origin);
}

// ---------------------------------------------------------------- keys

#[test]
fn key_json_has_the_fixed_structure() {
    let fake = Arc::new(Fake::new());
    let cache = mem_cache(&fake);
    let spec = spec();
    let kernel = render(&spec).unwrap();
    let key = cache.key(&kernel);
    let mut v = serde_json::to_value(&key).unwrap();

    let obj = v.as_object().unwrap();
    let fields: Vec<&str> = obj.keys().map(String::as_str).collect();
    let mut expected_fields = vec![
        "schema",
        "nsa_version",
        "kernel_id",
        "target",
        "output_kind",
        "compiler",
        "options",
        "source_blake3",
        "headers_blake3",
    ];
    let mut sorted = fields.clone();
    sorted.sort_unstable();
    expected_fields.sort_unstable();
    assert_eq!(sorted, expected_fields);

    assert!(is_hex(obj["source_blake3"].as_str().unwrap(), 64));
    assert_eq!(obj["headers_blake3"].as_str().unwrap(), nsa_kernels::render::headers_digest());
    v["source_blake3"] = json!("<blake3>");
    v["headers_blake3"] = json!("<blake3>");
    assert_eq!(
        v,
        json!({
            "schema": CACHE_SCHEMA,
            "nsa_version": env!("CARGO_PKG_VERSION"),
            "kernel_id": spec.id(),
            "target": "sm_90a",
            "output_kind": "cubin",
            "compiler": { "name": "fake", "version": "1.0", "build": "1.0 build" },
            "options": ["-O3", "--std=c++17", "--gpu-architecture=sm_90a"],
            "source_blake3": "<blake3>",
            "headers_blake3": "<blake3>",
        })
    );

    // Round-trips, and the canonical JSON is the compact serde form in field order.
    let back: CacheKey = serde_json::from_str(&key.canonical_json()).unwrap();
    assert_eq!(back, key);
    assert!(key.canonical_json().starts_with("{\"schema\":"));
}

#[test]
fn digest_of_a_literal_key_never_changes() {
    // Guards the canonical serialisation: if this changes, every cache on every
    // machine is invalidated, so bump CACHE_SCHEMA deliberately instead.
    let key = CacheKey {
        schema: 2,
        nsa_version: "0.1.0".into(),
        kernel_id: "kv_store.bf16.sm_90a".into(),
        target: "sm_90a".into(),
        output_kind: nsa_kernels::OutputKind::Cubin,
        compiler: CompilerIdentity {
            name: "nvrtc".into(),
            version: "13.0".into(),
            build: "13.0.88; libnvrtc 65be; builtins 0a1b".into(),
        },
        options: vec!["--gpu-architecture=sm_90a".into(), "-std=c++17".into()],
        source_blake3: "0".repeat(64),
        headers_blake3: "f".repeat(64),
    };
    assert_eq!(
        key.canonical_json(),
        format!(
            "{{\"schema\":2,\"nsa_version\":\"0.1.0\",\"kernel_id\":\"kv_store.bf16.sm_90a\",\
             \"target\":\"sm_90a\",\"output_kind\":\"cubin\",\
             \"compiler\":{{\"name\":\"nvrtc\",\"version\":\"13.0\",\
             \"build\":\"13.0.88; libnvrtc 65be; builtins 0a1b\"}},\
             \"options\":[\"--gpu-architecture=sm_90a\",\"-std=c++17\"],\
             \"source_blake3\":\"{}\",\"headers_blake3\":\"{}\"}}",
            "0".repeat(64),
            "f".repeat(64)
        )
    );
    let digest = key.digest();
    assert!(is_hex(&digest, 64));
    assert_eq!(digest, LITERAL_KEY_DIGEST);
    assert_eq!(key.entry_name(), format!("kv_store.bf16.sm_90a-{}", &digest[..32]));
}

const LITERAL_KEY_DIGEST: &str = "3fa22a54e490c2113d54858f7ac668292abd12aaa1a2fed5af0a9a946f1e174f";

#[test]
fn same_inputs_give_the_same_key_across_caches() {
    let a = mem_cache(&Arc::new(Fake::new()));
    let b = mem_cache(&Arc::new(Fake::new()));
    for spec in specs() {
        let ka = key_of(&a, &spec);
        let kb = key_of(&b, &spec);
        assert_eq!(ka, kb);
        assert_eq!(ka.digest(), kb.digest());
        assert_eq!(a.get(&spec).unwrap().key_digest, ka.digest());
        assert_eq!(b.get(&spec).unwrap().key_digest, ka.digest());
    }
}

#[test]
fn every_input_of_the_key_changes_the_digest() {
    let spec = spec();
    let kernel = render(&spec).unwrap();
    let base = mem_cache(&Arc::new(Fake::new())).key(&kernel).digest();

    let other_option = mem_cache(&Arc::new(Fake::with("fake", "1.0", &["-O2", "--std=c++17"]))).key(&kernel).digest();
    let extra_option =
        mem_cache(&Arc::new(Fake::with("fake", "1.0", &["-O3", "--std=c++17", "-lineinfo"]))).key(&kernel).digest();
    let reordered = mem_cache(&Arc::new(Fake::with("fake", "1.0", &["--std=c++17", "-O3"]))).key(&kernel).digest();
    let version = mem_cache(&Arc::new(Fake::with("fake", "1.1", &["-O3", "--std=c++17"]))).key(&kernel).digest();
    let name = mem_cache(&Arc::new(Fake::with("other", "1.0", &["-O3", "--std=c++17"]))).key(&kernel).digest();
    let mut edited = kernel.clone();
    edited.source.push_str("\n// one more line\n");
    let source = mem_cache(&Arc::new(Fake::new())).key(&edited).digest();
    let other_target =
        mem_cache(&Arc::new(Fake::new())).key(&render(&KernelSpec::new(spec.family, Target::Sm100a)).unwrap()).digest();

    let all = [&base, &other_option, &extra_option, &reordered, &version, &name, &source, &other_target];
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert_ne!(a, b, "two different inputs gave one digest");
        }
    }
}

// ---------------------------------------------------------------- memory layer

#[test]
fn memory_hit_returns_the_same_arc() {
    let fake = Arc::new(Fake::new());
    let cache = mem_cache(&fake);
    let spec = spec();
    let a = cache.get(&spec).unwrap();
    let b = cache.get(&spec).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_compiled(&a);
    assert_eq!(a.id, spec.id());
    assert_eq!(a.symbol, spec.symbol());
    assert_eq!(a.spec, spec);
    assert_eq!(a.source_path, None);
    assert_eq!(a.image.bytes, Fake::image_for(&render(&spec).unwrap()));
    // The rendered path shares the slot.
    let c = cache.get_rendered(&render(&spec).unwrap()).unwrap();
    assert!(Arc::ptr_eq(&a, &c));
    assert_eq!(fake.calls(), 1);
    let s = cache.stats();
    assert_eq!((s.compiles, s.memory_hits, s.disk_hits), (1, 2, 0));
}

#[test]
fn memory_hit_is_cheap() {
    let cache = mem_cache(&Arc::new(Fake::new()));
    let spec = spec();
    cache.get(&spec).unwrap();
    let n = 100_000u32;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(cache.get(std::hint::black_box(&spec)).unwrap());
    }
    let per_hit = t.elapsed() / n;
    eprintln!("memory hit: {per_hit:?} per get (this build's profile)");
    // Generous bound so unoptimised builds on a loaded machine pass; release is ~30 ns.
    assert!(per_hit < Duration::from_micros(20), "{per_hit:?} per hit");
}

#[test]
fn concurrent_callers_of_one_key_compile_once() {
    let dir = tempfile::tempdir().unwrap();
    for root in [None, Some(dir.path())] {
        let fake = Arc::new(Fake::new().sleeping(Duration::from_millis(100)));
        let cache = match root {
            Some(r) => disk_cache(&fake, r),
            None => mem_cache(&fake),
        };
        let spec = spec();
        let barrier = Barrier::new(8);
        let got: Vec<Arc<CachedKernel>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        cache.get(&spec).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(fake.calls(), 1);
        assert!(got.iter().all(|k| Arc::ptr_eq(k, &got[0])));
        let s = cache.stats();
        assert_eq!((s.compiles, s.memory_hits), (1, 7));
    }
}

#[test]
fn concurrent_callers_of_different_keys_each_compile_once() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::new().sleeping(Duration::from_millis(20)));
    let cache = disk_cache(&fake, dir.path());
    let specs = specs();
    let barrier = Barrier::new(specs.len() * 4);
    std::thread::scope(|s| {
        for spec in &specs {
            for _ in 0..4 {
                s.spawn(|| {
                    barrier.wait();
                    assert_eq!(cache.get(spec).unwrap().spec, *spec);
                });
            }
        }
    });
    assert_eq!(fake.calls(), specs.len());
    assert_eq!(cache.stats().compiles, specs.len() as u64);
}

#[test]
fn a_failed_compile_is_not_cached() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::new());
    fake.fail_next.store(1, Ordering::SeqCst);
    let cache = disk_cache(&fake, dir.path());
    let spec = spec();
    let err = cache.get(&spec).unwrap_err();
    match &err {
        Error::Compile { id, source_path, .. } => {
            assert_eq!(id, &spec.id());
            let path = PathBuf::from(source_path);
            assert!(path.starts_with(dir.path().join(FAILED_DIR)), "{}", path.display());
            assert_eq!(fs::read_to_string(&path).unwrap(), render(&spec).unwrap().source);
        }
        other => panic!("expected a compile error, got {other}"),
    }
    assert!(err.to_string().contains("told to fail"));
    // Nothing was published for the failed key.
    assert!(!entry_dir(&cache, &spec).exists());

    let k = cache.get(&spec).unwrap();
    assert_compiled(&k);
    assert_eq!(fake.calls(), 2);
    let s = cache.stats();
    assert_eq!((s.compile_failures, s.compiles), (1, 1));
    assert!(entry_dir(&cache, &spec).join(IMAGE_FILE).is_file());
}

#[test]
fn a_panicking_compiler_does_not_wedge_the_key() {
    let fake = Arc::new(Fake::new());
    *fake.hook.lock().unwrap() = Some(Box::new(|_| panic!("compiler exploded")));
    let cache = mem_cache(&fake);
    let spec = spec();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cache.get(&spec)));
    assert!(r.is_err());
    // The hook's lock was held by the panicking compile.
    *fake.hook.lock().unwrap_or_else(|e| e.into_inner()) = None;
    assert_compiled(&cache.get(&spec).unwrap());
    assert_eq!(fake.calls(), 2);
}

// ---------------------------------------------------------------- disk layer

#[test]
fn disk_entry_layout_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(Fake::new());
    let cache = disk_cache(&fake, dir.path());
    assert_eq!(cache.root(), Some(dir.path()));
    let spec = spec();
    let kernel = render(&spec).unwrap();
    let key = cache.key(&kernel);
    let first = cache.get(&spec).unwrap();
    assert_compiled(&first);

    let entry = cache.entry_dir(&key).unwrap();
    assert_eq!(entry, dir.path().join(format!("v{CACHE_SCHEMA}")).join(key.entry_name()));
    assert!(key.entry_name().starts_with(&format!("{}-", spec.id())));
    assert_eq!(names_in(&entry), vec![IMAGE_FILE, META_FILE, SOURCE_FILE]);
    assert_eq!(
        names_in(&dir.path().join(format!("v{CACHE_SCHEMA}"))),
        vec![key.entry_name(), format!("{}{LOCK_SUFFIX}", key.entry_name())],
        "the entry and its lock file; no temporary directories are left behind"
    );
    assert_eq!(first.source_path, Some(entry.join(SOURCE_FILE)));
    assert_eq!(fs::read_to_string(entry.join(SOURCE_FILE)).unwrap(), kernel.source);
    assert_eq!(fs::read(entry.join(IMAGE_FILE)).unwrap(), first.image.bytes);

    let meta: EntryMeta = serde_json::from_slice(&fs::read(entry.join(META_FILE)).unwrap()).unwrap();
    assert_eq!(meta.key, serde_json::to_value(&key).unwrap());
    assert_eq!(meta.key_digest, key.digest());
    assert_eq!(meta.symbol, spec.symbol());
    assert_eq!(meta.image_size, first.image.bytes.len() as u64);
    assert!(is_hex(&meta.image_blake3, 64));
    assert_eq!(meta.log, first.image.log);
    assert_eq!(meta.resources, first.image.resources);
    assert!(meta.created_unix_ms > 1_600_000_000_000);

    // A second cache (a new process) loads it instead of compiling.
    let fake2 = Arc::new(Fake::new());
    let cache2 = disk_cache(&fake2, dir.path());
    let second = cache2.get(&spec).unwrap();
    assert_from_disk(&second);
    assert_eq!(fake2.calls(), 0);
    assert_eq!(second.image, first.image);
    assert_eq!(second.key_digest, first.key_digest);
    assert_eq!(second.source_path, first.source_path);
    let s = cache2.stats();
    assert_eq!((s.disk_hits, s.compiles, s.quarantined), (1, 0, 0));
    // ... and then serves it from memory.
    assert!(Arc::ptr_eq(&second, &cache2.get(&spec).unwrap()));
}

#[test]
fn another_compiler_version_gets_its_own_entry() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let old = Arc::new(Fake::with("fake", "1.0", &["-O3"]));
    let new = Arc::new(Fake::with("fake", "2.0", &["-O3"]));
    disk_cache(&old, dir.path()).get(&spec).unwrap();
    assert_compiled(&disk_cache(&new, dir.path()).get(&spec).unwrap());
    assert_eq!((old.calls(), new.calls()), (1, 1));
    assert_eq!(entries_in(dir.path()).len(), 2);
    // Both stay valid.
    assert_from_disk(&disk_cache(&Arc::new(Fake::with("fake", "1.0", &["-O3"])), dir.path()).get(&spec).unwrap());
}

/// Bakes one entry, damages it with `corrupt`, and checks that a fresh cache
/// quarantines it, recompiles, republishes, and that the result loads again.
fn heals_after(what: &str, corrupt: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let baker = Arc::new(Fake::new());
    let baked = disk_cache(&baker, dir.path()).get(&spec).unwrap();
    let cache = disk_cache(&Arc::new(Fake::new()), dir.path());
    let entry = entry_dir(&cache, &spec);
    let entry_name = entry.file_name().unwrap().to_string_lossy().into_owned();
    corrupt(&entry);

    let fake = Arc::new(Fake::new());
    let cache = disk_cache(&fake, dir.path());
    let healed = cache.get(&spec).unwrap();
    assert_compiled(&healed);
    assert_eq!(fake.calls(), 1, "{what}: recompiled once");
    assert_eq!(healed.image, baked.image, "{what}");
    let s = cache.stats();
    assert_eq!((s.quarantined, s.disk_hits, s.compiles), (1, 0, 1), "{what}");

    let quarantined = names_in(&dir.path().join(QUARANTINE_DIR));
    assert_eq!(quarantined.len(), 1, "{what}: {quarantined:?}");
    assert!(quarantined[0].starts_with(&format!("{entry_name}-")), "{what}: {quarantined:?}");

    // The entry was republished and is good again.
    let fake3 = Arc::new(Fake::new());
    let again = disk_cache(&fake3, dir.path()).get(&spec).unwrap();
    assert_from_disk(&again);
    assert_eq!(fake3.calls(), 0, "{what}");
    assert_eq!(again.image, baked.image, "{what}");
}

#[test]
fn flipped_image_byte_is_quarantined_and_recompiled() {
    heals_after("flipped byte", |entry| {
        let path = entry.join(IMAGE_FILE);
        let mut bytes = fs::read(&path).unwrap();
        bytes[3] ^= 0x40;
        fs::write(&path, bytes).unwrap();
    });
    // The quarantined copy is kept as found.
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let cache = disk_cache(&Arc::new(Fake::new()), dir.path());
    let good = cache.get(&spec).unwrap().image.bytes.clone();
    let path = entry_dir(&cache, &spec).join(IMAGE_FILE);
    let mut bad = good.clone();
    bad[0] ^= 1;
    fs::write(&path, &bad).unwrap();
    disk_cache(&Arc::new(Fake::new()), dir.path()).get(&spec).unwrap();
    let q = dir.path().join(QUARANTINE_DIR);
    let name = &names_in(&q)[0];
    assert_eq!(fs::read(q.join(name).join(IMAGE_FILE)).unwrap(), bad);
    assert_eq!(fs::read(&path).unwrap(), good);
}

#[test]
fn truncated_meta_heals() {
    heals_after("truncated meta.json", |entry| {
        let path = entry.join(META_FILE);
        let text = fs::read(&path).unwrap();
        fs::write(&path, &text[..text.len() / 2]).unwrap();
    });
}

#[test]
fn empty_meta_heals() {
    heals_after("empty meta.json", |entry| fs::write(entry.join(META_FILE), b"").unwrap());
}

#[test]
fn missing_image_heals() {
    heals_after("missing image.bin", |entry| fs::remove_file(entry.join(IMAGE_FILE)).unwrap());
}

#[test]
fn missing_meta_heals() {
    heals_after("missing meta.json", |entry| fs::remove_file(entry.join(META_FILE)).unwrap());
}

#[test]
fn truncated_image_heals() {
    heals_after("truncated image.bin", |entry| {
        let path = entry.join(IMAGE_FILE);
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    });
}

#[test]
fn meta_with_another_key_heals() {
    heals_after("key mismatch", |entry| {
        let path = entry.join(META_FILE);
        let mut meta: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        meta["key"]["options"] = json!(["-O0"]);
        fs::write(&path, serde_json::to_vec(&meta).unwrap()).unwrap();
    });
}

#[test]
fn entry_that_is_a_file_heals() {
    heals_after("entry is a file", |entry| {
        fs::remove_dir_all(entry).unwrap();
        fs::write(entry, b"not a directory").unwrap();
    });
}

#[test]
fn losing_the_publish_race_keeps_the_winner() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let root = dir.path().to_path_buf();
    // While we compile, "another process" publishes the same key (one on a
    // filesystem without locks, which does not wait for ours).
    let fake = Arc::new(Fake::new());
    *fake.hook.lock().unwrap() = Some(Box::new(move |kernel| {
        let other = KernelCache::new(Arc::new(Fake::new()), CacheConfig::at(&root).with_lock_wait(None));
        assert_compiled(&other.get(&kernel.spec).unwrap());
    }));
    let cache = disk_cache(&fake, dir.path());
    let k = cache.get(&spec).unwrap();
    assert_compiled(&k);
    let entry = entry_dir(&cache, &spec);
    assert_eq!(k.source_path, Some(entry.join(SOURCE_FILE)));
    assert_eq!(
        entries_in(dir.path()),
        vec![entry.file_name().unwrap().to_string_lossy().into_owned()],
        "our temporary directory was cleaned up"
    );
    assert!(names_in(entry.parent().unwrap()).iter().all(|n| !n.starts_with(".tmp-")));
    let check = Arc::new(Fake::new());
    let loaded = disk_cache(&check, dir.path()).get(&spec).unwrap();
    assert_from_disk(&loaded);
    assert_eq!(loaded.image, k.image);
}

// ---------------------------------------------------------------- NSA_JIT=off

#[test]
fn jit_off_miss_is_a_clear_error_and_never_compiles() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let fake = Arc::new(Fake::new());
    let cache = KernelCache::new(fake.clone(), CacheConfig::at(dir.path()).with_jit(JitPolicy::Off));
    assert_eq!(cache.jit_policy(), JitPolicy::Off);
    let err = cache.get(&spec).unwrap_err();
    match &err {
        Error::JitDisabledMiss { id, cache_dir, .. } => {
            assert_eq!(id, &spec.id());
            assert_eq!(cache_dir, &dir.path().display().to_string());
        }
        other => panic!("expected JitDisabledMiss, got {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&spec.id()) && msg.contains("NSA_JIT"), "{msg}");
    assert_eq!(fake.calls(), 0);
    // A failed look-up writes nothing.
    assert!(names_in(dir.path()).is_empty());
    // Still a miss the second time (errors are not cached as successes).
    assert!(matches!(cache.get(&spec), Err(Error::JitDisabledMiss { .. })));

    // Memory only: same error, no compile.
    let mem = KernelCache::new(fake.clone(), CacheConfig::memory_only().with_jit(JitPolicy::Off));
    assert!(matches!(mem.get(&spec), Err(Error::JitDisabledMiss { id, .. }) if id == spec.id()));
    assert_eq!(fake.calls(), 0);
}

#[test]
fn jit_off_hit_after_a_bake() {
    let dir = tempfile::tempdir().unwrap();
    let baker = Arc::new(Fake::new());
    let bake = disk_cache(&baker, dir.path());
    for spec in specs() {
        bake.get(&spec).unwrap();
    }
    let fake = Arc::new(Fake::new());
    let cache = KernelCache::new(fake.clone(), CacheConfig::at(dir.path()).with_jit(JitPolicy::Off));
    for spec in specs() {
        let k = cache.get(&spec).unwrap();
        assert_from_disk(&k);
        assert_eq!(k.image.bytes, Fake::image_for(&render(&spec).unwrap()));
    }
    assert_eq!(fake.calls(), 0);
    assert_eq!(cache.stats().disk_hits, specs().len() as u64);

    // A bake by another compiler version does not count.
    let newer = Arc::new(Fake::with("fake", "9.9", &["-O3", "--std=c++17"]));
    let cache = KernelCache::new(newer.clone(), CacheConfig::at(dir.path()).with_jit(JitPolicy::Off));
    assert!(matches!(cache.get(&spec()), Err(Error::JitDisabledMiss { .. })));
    assert_eq!(newer.calls(), 0);
}

#[test]
fn jit_off_with_a_corrupt_entry_quarantines_then_misses() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let bake = disk_cache(&Arc::new(Fake::new()), dir.path());
    bake.get(&spec).unwrap();
    fs::write(entry_dir(&bake, &spec).join(IMAGE_FILE), b"garbage").unwrap();
    let fake = Arc::new(Fake::new());
    let cache = KernelCache::new(fake.clone(), CacheConfig::at(dir.path()).with_jit(JitPolicy::Off));
    assert!(matches!(cache.get(&spec), Err(Error::JitDisabledMiss { .. })));
    assert_eq!(fake.calls(), 0);
    assert_eq!(cache.stats().quarantined, 1);
    assert_eq!(names_in(&dir.path().join(QUARANTINE_DIR)).len(), 1);
}

// ---------------------------------------------------------------- unwritable roots

#[test]
fn root_under_a_regular_file_still_compiles() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let root = file.path().join("sub");
    let fake = Arc::new(Fake::new());
    let cache = disk_cache(&fake, &root);
    for spec in specs() {
        let k = cache.get(&spec).unwrap();
        assert_compiled(&k);
        assert_eq!(k.source_path, None);
        assert!(Arc::ptr_eq(&k, &cache.get(&spec).unwrap()));
    }
    assert_eq!(fake.calls(), specs().len());
    assert!(!root.exists());

    // A failed compile still dumps its source somewhere readable.
    let failing = Arc::new(Fake::new());
    failing.fail_next.store(1, Ordering::SeqCst);
    match disk_cache(&failing, &root).get(&spec()) {
        Err(Error::Compile { source_path, .. }) => {
            assert!(Path::new(&source_path).is_file(), "{source_path}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[cfg(unix)]
#[test]
fn read_only_root_still_compiles_and_serves_reads() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let specs = specs();
    // Bake one kernel, then make everything read-only.
    disk_cache(&Arc::new(Fake::new()), dir.path()).get(&spec).unwrap();
    let set_mode = |mode: u32| {
        let mut dirs = vec![dir.path().to_path_buf()];
        while let Some(d) = dirs.pop() {
            fs::set_permissions(&d, fs::Permissions::from_mode(mode)).unwrap();
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                }
            }
        }
    };
    set_mode(0o555);
    // Root (the usual test user) is not stopped by modes; only assert what holds
    // either way.
    let probe = dir.path().join("probe");
    let writable = fs::write(&probe, b"").is_ok();
    let _ = fs::remove_file(&probe);

    let fake = Arc::new(Fake::new());
    let cache = disk_cache(&fake, dir.path());
    assert_from_disk(&cache.get(&spec).unwrap());
    for other in &specs[1..] {
        let k = cache.get(other).unwrap();
        assert_compiled(&k);
        if !writable {
            assert_eq!(k.source_path, None);
        }
    }
    assert_eq!(fake.calls(), specs.len() - 1);
    set_mode(0o755);
}

// ---------------------------------------------------------------- config and helpers

#[test]
fn config_from_vars() {
    let c = CacheConfig::from_vars(vars(&[("NSA_CACHE_DIR", "/x/y"), ("NSA_JIT", "off")])).unwrap();
    assert_eq!(c.root, Some(PathBuf::from("/x/y")));
    assert_eq!(c.jit, JitPolicy::Off);

    let c = CacheConfig::from_vars(vars(&[])).unwrap();
    assert_eq!(c.root, CacheConfig::default_root());
    assert_eq!(c.jit, JitPolicy::Enabled);
    if let Some(root) = &c.root {
        assert!(root.ends_with("nsa"));
    }

    let c = CacheConfig::from_vars(vars(&[("NSA_CACHE_DIR", "")])).unwrap();
    assert_eq!(c.root, CacheConfig::default_root());

    // A typo must not silently turn compiling back on in an offline image.
    let err = CacheConfig::from_vars(vars(&[("NSA_JIT", "of")])).unwrap_err().to_string();
    assert!(err.contains("NSA_JIT") && err.contains("\"of\"") && err.contains("`off`"), "{err}");

    for off in ["off", "OFF", "0", "false", "no", " off "] {
        assert_eq!(JitPolicy::parse(off), Some(JitPolicy::Off), "{off}");
    }
    for on in ["", "on", "1", "true", "yes"] {
        assert_eq!(JitPolicy::parse(on), Some(JitPolicy::Enabled), "{on}");
    }
    assert_eq!(JitPolicy::parse("maybe"), None);
}

#[test]
fn dump_source_writes_under_the_root_or_temp() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = render(&spec()).unwrap();
    let p = dump_source(&kernel, Some(dir.path()));
    assert_eq!(p.parent().unwrap(), dir.path().join(FAILED_DIR));
    let name = p.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(&format!("{}-", kernel.id)) && name.ends_with(".cu"), "{name}");
    assert_eq!(fs::read_to_string(&p).unwrap(), kernel.source);
    // Same source, same name.
    assert_eq!(dump_source(&kernel, Some(dir.path())), p);

    let t = dump_source(&kernel, None);
    assert!(t.starts_with(std::env::temp_dir()), "{}", t.display());
    assert_eq!(fs::read_to_string(&t).unwrap(), kernel.source);
}

fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
    move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
}

// ---------------------------------------------------------------- processes sharing a root

/// The entry directories under the schema directory (no lock files, no staging).
fn entries_in(root: &Path) -> Vec<String> {
    names_in(&root.join(format!("v{CACHE_SCHEMA}")))
        .into_iter()
        .filter(|n| !n.ends_with(LOCK_SUFFIX) && !n.starts_with(".tmp-"))
        .collect()
}

#[test]
fn a_second_cache_waits_for_the_first_compile_of_a_key_and_loads_it() {
    // Two caches on one root stand for two processes: the lock is a file lock, so
    // it excludes other open files in this process as it would other processes.
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let slow = Arc::new(Fake::new().sleeping(Duration::from_millis(400)));
    let other = Arc::new(Fake::new());
    let (a, b) = (disk_cache(&slow, dir.path()), disk_cache(&other, dir.path()));
    let started = Barrier::new(2);
    let (ka, kb) = std::thread::scope(|s| {
        let ta = s.spawn(|| {
            started.wait();
            a.get(&spec).unwrap()
        });
        let tb = s.spawn(|| {
            started.wait();
            std::thread::sleep(Duration::from_millis(100));
            b.get(&spec).unwrap()
        });
        (ta.join().unwrap(), tb.join().unwrap())
    });
    assert_compiled(&ka);
    assert_from_disk(&kb);
    assert_eq!((slow.calls(), other.calls()), (1, 0), "one compile for the key");
    assert_eq!(ka.image, kb.image);
}

#[test]
fn without_locks_two_caches_both_compile_and_the_first_publish_wins() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let fakes = [Arc::new(Fake::new().sleeping(Duration::from_millis(200))), Arc::new(Fake::new())];
    let caches: Vec<KernelCache> =
        fakes.iter().map(|f| KernelCache::new(f.clone(), CacheConfig::at(dir.path()).with_lock_wait(None))).collect();
    std::thread::scope(|s| {
        for c in &caches {
            s.spawn(|| assert_compiled(&c.get(&spec).unwrap()));
        }
    });
    assert_eq!((fakes[0].calls(), fakes[1].calls()), (1, 1));
    assert_eq!(entries_in(dir.path()).len(), 1);
}

#[test]
fn a_staging_directory_whose_writer_is_gone_is_removed_by_the_next_process() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let bake = disk_cache(&Arc::new(Fake::new()), dir.path());
    bake.get(&spec).unwrap();
    let entry = entry_dir(&bake, &spec);
    let schema = entry.parent().unwrap().to_path_buf();
    let name = entry.file_name().unwrap().to_string_lossy().into_owned();
    // What a compile killed mid-write leaves, for this key and for one never published.
    let dead = schema.join(format!(".tmp-{name}-AbC123"));
    let orphan_entry = "topk.k64.sm_90a-0123456789abcdef0123456789abcdef";
    let orphan = schema.join(format!(".tmp-{orphan_entry}-Zz9"));
    fs::write(schema.join(format!("{orphan_entry}{LOCK_SUFFIX}")), b"").unwrap();
    // One with no lock file (a writer on a filesystem without locks), an hour old.
    let lockless = schema.join(".tmp-topk.k128.sm_90a-00000000000000000000000000000000-Yy8");
    let recent_lockless = schema.join(".tmp-topk.k192.sm_90a-00000000000000000000000000000000-Xx7");
    for d in [&dead, &orphan, &lockless, &recent_lockless] {
        fs::create_dir_all(d).unwrap();
        fs::write(d.join(IMAGE_FILE), b"partial").unwrap();
    }
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
    fs::File::open(&lockless).unwrap().set_modified(two_hours_ago).unwrap();
    // A staging directory whose writer still holds the key's lock is left alone.
    let live_entry = format!("{}-{}", specs()[1].id(), "f".repeat(32));
    let live = schema.join(format!(".tmp-{live_entry}-Qq1"));
    fs::create_dir_all(&live).unwrap();
    let held = fs::File::create(schema.join(format!("{live_entry}{LOCK_SUFFIX}"))).unwrap();
    assert!(nsa_runtime::fsread::try_lock_exclusive(&held).unwrap());

    let next = disk_cache(&Arc::new(Fake::new()), dir.path());
    assert_from_disk(&next.get(&spec).unwrap());
    assert!(!dead.exists() && !orphan.exists(), "stale staging directories removed");
    assert!(!lockless.exists(), "an hour-old one without a lock file is removed");
    assert!(recent_lockless.exists(), "a recent one without a lock file may still be written");
    assert!(live.exists(), "a live writer's directory is kept");
    drop(held);
}

#[test]
fn quarantine_and_failed_sources_keep_only_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let qdir = dir.path().join(QUARANTINE_DIR);
    let fdir = dir.path().join(FAILED_DIR);
    for i in 0..40 {
        fs::create_dir_all(qdir.join(format!("old-{i}"))).unwrap();
        fs::create_dir_all(&fdir).unwrap();
        fs::write(fdir.join(format!("old-{i}.cu")), b"x").unwrap();
    }
    for i in 0..100 {
        fs::write(fdir.join(format!("older-{i}.cu")), b"x").unwrap();
    }
    let fake = Arc::new(Fake::new());
    let cache = disk_cache(&fake, dir.path());
    cache.get(&spec).unwrap();
    assert_eq!(names_in(&qdir).len(), QUARANTINE_KEEP);
    assert_eq!(names_in(&fdir).len(), FAILED_KEEP);
    // A new bad entry is kept, among the newest.
    fs::write(entry_dir(&cache, &spec).join(IMAGE_FILE), b"garbage").unwrap();
    disk_cache(&Arc::new(Fake::new()), dir.path()).get(&spec).unwrap();
    let q = names_in(&qdir);
    assert_eq!(q.len(), QUARANTINE_KEEP);
    assert!(q.iter().any(|n| n.starts_with(&spec.id())), "{q:?}");
}

#[test]
fn kernels_that_could_not_be_saved_are_listed() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let cache = disk_cache(&Arc::new(Fake::new()), &file.path().join("sub"));
    for spec in specs().iter().take(3) {
        cache.get(spec).unwrap();
    }
    let unsaved = cache.unpersisted();
    assert_eq!(unsaved.len(), 3, "{unsaved:?}");
    assert!(unsaved[0].entry.starts_with(&specs()[0].id()), "{unsaved:?}");
    assert!(!unsaved[0].reason.is_empty());
    // A writable root lists nothing.
    let dir = tempfile::tempdir().unwrap();
    let ok = disk_cache(&Arc::new(Fake::new()), dir.path());
    ok.get(&spec()).unwrap();
    assert!(ok.unpersisted().is_empty());
}

// ---------------------------------------------------------------- hostile entries

/// Replaces a baked entry's `file` with what `make` puts at the path, and checks
/// that the next cache sets the entry aside within a second and recompiles.
fn refuses_within_a_second(what: &str, file: &str, make: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let bake = disk_cache(&Arc::new(Fake::new()), dir.path());
    bake.get(&spec).unwrap();
    let path = entry_dir(&bake, &spec).join(file);
    fs::remove_file(&path).unwrap();
    make(&path);
    let fake = Arc::new(Fake::new());
    let cache = disk_cache(&fake, dir.path());
    let t = Instant::now();
    assert_compiled(&cache.get(&spec).unwrap());
    assert!(t.elapsed() < Duration::from_secs(1), "{what}: took {:?}", t.elapsed());
    assert_eq!(cache.stats().quarantined, 1, "{what}");
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

#[test]
fn fifos_devices_links_and_oversized_files_in_an_entry_are_refused_at_once() {
    refuses_within_a_second("FIFO image", IMAGE_FILE, mkfifo);
    refuses_within_a_second("FIFO meta", META_FILE, mkfifo);
    refuses_within_a_second("link to /dev/zero", IMAGE_FILE, |p| std::os::unix::fs::symlink("/dev/zero", p).unwrap());
    refuses_within_a_second("link to a good file", META_FILE, |p| {
        let real = p.with_extension("real");
        fs::write(&real, b"{}").unwrap();
        std::os::unix::fs::symlink(&real, p).unwrap();
    });
    refuses_within_a_second("sparse 2 GiB image", IMAGE_FILE, |p| {
        fs::File::create(p).unwrap().set_len(2 << 30).unwrap();
    });
    refuses_within_a_second("sparse 2 GiB meta", META_FILE, |p| {
        fs::File::create(p).unwrap().set_len(2 << 30).unwrap();
    });
}

#[test]
fn an_entry_that_is_a_link_out_of_the_root_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let spec = spec();
    let bake = disk_cache(&Arc::new(Fake::new()), elsewhere.path());
    bake.get(&spec).unwrap();
    let cache = disk_cache(&Arc::new(Fake::new()), dir.path());
    let entry = entry_dir(&cache, &spec);
    fs::create_dir_all(entry.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(entry_dir(&bake, &spec), &entry).unwrap();
    assert_compiled(&cache.get(&spec).unwrap());
    assert_eq!(cache.stats().quarantined, 1);
}

#[test]
fn an_image_without_the_kernel_s_entry_point_is_refused_even_with_a_matching_meta() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (specs()[0], specs()[1]);
    let bake = disk_cache(&Arc::new(Fake::new()), dir.path());
    bake.get(&a).unwrap();
    bake.get(&b).unwrap();
    // Swap in b's image, and make a's meta vouch for it.
    let (ea, eb) = (entry_dir(&bake, &a), entry_dir(&bake, &b));
    let image = fs::read(eb.join(IMAGE_FILE)).unwrap();
    fs::write(ea.join(IMAGE_FILE), &image).unwrap();
    let mut meta: EntryMeta = serde_json::from_slice(&fs::read(ea.join(META_FILE)).unwrap()).unwrap();
    meta.image_size = image.len() as u64;
    meta.image_blake3 = blake3::hash(&image).to_hex().to_string();
    fs::write(ea.join(META_FILE), serde_json::to_vec(&meta).unwrap()).unwrap();
    let fake = Arc::new(Fake::new());
    let k = disk_cache(&fake, dir.path()).get(&a).unwrap();
    assert_compiled(&k);
    assert_eq!(k.image.bytes, Fake::image_for(&render(&a).unwrap()));
}

// ---------------------------------------------------------------- a compiler that is not there

#[test]
fn an_absent_compiler_serves_entries_of_any_build_and_cannot_compile() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let baked = disk_cache(&Arc::new(Fake::new()), dir.path()).get(&spec).unwrap();
    for jit in [JitPolicy::Off, JitPolicy::Enabled] {
        let absent = Arc::new(Fake::new().absent());
        let cache = KernelCache::new(absent.clone(), CacheConfig::at(dir.path()).with_jit(jit));
        let k = cache.get(&spec).unwrap();
        assert_from_disk(&k);
        assert_eq!(k.image, baked.image);
        assert_eq!(absent.calls(), 0);
        // A kernel never baked: a miss, said as such.
        let other = specs()[1];
        match (jit, cache.get(&other)) {
            (JitPolicy::Off, Err(Error::JitDisabledMiss { .. })) => {}
            (JitPolicy::Enabled, Err(Error::NvrtcNotFound(_))) => {}
            (_, other) => panic!("{jit:?}: unexpected {other:?}"),
        }
    }
    // Entries of other options or sources are not taken.
    let other_options = Arc::new(Fake::with("fake", "1.0", &["-O1"]).absent());
    let cache = KernelCache::new(other_options, CacheConfig::at(dir.path()).with_jit(JitPolicy::Off));
    assert!(matches!(cache.get(&spec), Err(Error::JitDisabledMiss { .. })));
}

#[test]
fn the_newest_build_wins_when_several_match() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    disk_cache(&Arc::new(Fake::with("fake", "1.0", &["-O3", "--std=c++17"])), dir.path()).get(&spec).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let newer = Fake::with("fake", "1.1", &["-O3", "--std=c++17"]);
    disk_cache(&Arc::new(newer), dir.path()).get(&spec).unwrap();
    assert_eq!(entries_in(dir.path()).len(), 2);
    let cache = KernelCache::new(Arc::new(Fake::new().absent()), CacheConfig::at(dir.path()).with_jit(JitPolicy::Off));
    let k = cache.get(&spec).unwrap();
    let meta: EntryMeta =
        serde_json::from_slice(&fs::read(k.source_path.as_ref().unwrap().with_file_name(META_FILE)).unwrap()).unwrap();
    assert_eq!(meta.key["compiler"]["version"], "1.1");
}

#[test]
fn jit_off_with_a_corrupt_entry_says_so_in_one_error() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec();
    let bake = disk_cache(&Arc::new(Fake::new()), dir.path());
    bake.get(&spec).unwrap();
    fs::write(entry_dir(&bake, &spec).join(IMAGE_FILE), b"garbage").unwrap();
    let cache = KernelCache::new(Arc::new(Fake::new()), CacheConfig::at(dir.path()).with_jit(JitPolicy::Off));
    let msg = cache.get(&spec).unwrap_err().to_string();
    assert!(msg.contains("was bad and was set aside") && msg.contains("NSA_JIT=off forbids"), "{msg}");
    assert!(!msg.contains("recompiling"), "{msg}");
}

#[test]
fn a_relative_cache_dir_is_made_absolute_at_once() {
    let c = CacheConfig::from_vars(vars(&[("NSA_CACHE_DIR", "rel/cache")])).unwrap();
    let root = c.root.unwrap();
    assert!(root.is_absolute(), "{}", root.display());
    assert_eq!(root, std::env::current_dir().unwrap().join("rel/cache"));
}
