//! Kernel cache tests with a fake compiler: keys, memory layer, disk layer,
//! self-healing, concurrency, `NSA_JIT=off` and unwritable roots.

use nsa_kernels::{render, KernelSpec, RenderedKernel, Target};
use nsa_runtime::cache::{
    dump_source, CacheConfig, CacheKey, CachedKernel, EntryMeta, JitPolicy, KernelCache, Origin, CACHE_SCHEMA,
    FAILED_DIR, IMAGE_FILE, META_FILE, QUARANTINE_DIR, SOURCE_FILE,
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
            identity: CompilerIdentity { name: name.into(), version: version.into() },
            options: options.iter().map(|s| s.to_string()).collect(),
            calls: AtomicUsize::new(0),
            fail_next: AtomicUsize::new(0),
            sleep: Duration::ZERO,
            hook: Mutex::new(None),
        }
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
        bytes.extend_from_slice(kernel.id.as_bytes());
        bytes.push(0);
        bytes.extend(kernel.source.bytes().rev());
        bytes
    }
}

impl Compiler for Fake {
    fn identity(&self) -> &CompilerIdentity {
        &self.identity
    }

    fn options(&self, target: Target) -> Vec<String> {
        let mut o = self.options.clone();
        o.push(format!("--gpu-architecture={}", target.arch()));
        o
    }

    fn compile(&self, kernel: &RenderedKernel) -> Result<CompiledImage> {
        self.calls.fetch_add(1, Ordering::SeqCst);
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
            "compiler": { "name": "fake", "version": "1.0" },
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
        schema: 1,
        nsa_version: "0.1.0".into(),
        kernel_id: "kv_store.bf16.sm_90a".into(),
        target: "sm_90a".into(),
        output_kind: nsa_kernels::OutputKind::Cubin,
        compiler: CompilerIdentity { name: "nvrtc".into(), version: "13.0".into() },
        options: vec!["--gpu-architecture=sm_90a".into(), "-std=c++17".into()],
        source_blake3: "0".repeat(64),
        headers_blake3: "f".repeat(64),
    };
    assert_eq!(
        key.canonical_json(),
        format!(
            "{{\"schema\":1,\"nsa_version\":\"0.1.0\",\"kernel_id\":\"kv_store.bf16.sm_90a\",\
             \"target\":\"sm_90a\",\"output_kind\":\"cubin\",\
             \"compiler\":{{\"name\":\"nvrtc\",\"version\":\"13.0\"}},\
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

const LITERAL_KEY_DIGEST: &str = "8b3db7d3ad7b15cdc8aaf6646ef41b9f9e6c0fce86df03ffc294f1d3ee1d92c3";

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
        vec![key.entry_name()],
        "no temporary directories are left behind"
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
    assert_eq!(names_in(&dir.path().join(format!("v{CACHE_SCHEMA}"))).len(), 2);
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
    // While we compile, "another process" publishes the same key.
    let fake = Arc::new(Fake::new());
    *fake.hook.lock().unwrap() = Some(Box::new(move |kernel| {
        let other = Arc::new(Fake::new());
        assert_compiled(&disk_cache(&other, &root).get(&kernel.spec).unwrap());
    }));
    let cache = disk_cache(&fake, dir.path());
    let k = cache.get(&spec).unwrap();
    assert_compiled(&k);
    let entry = entry_dir(&cache, &spec);
    assert_eq!(k.source_path, Some(entry.join(SOURCE_FILE)));
    assert_eq!(
        names_in(entry.parent().unwrap()),
        vec![entry.file_name().unwrap().to_string_lossy().into_owned()],
        "our temporary directory was cleaned up"
    );
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
        Error::JitDisabledMiss { id, cache_dir } => {
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
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
    };
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
