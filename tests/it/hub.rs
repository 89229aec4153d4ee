//! Models by name, end to end against a hub on the loopback address.
//!
//! `Hub` is a small HTTP/1.1 server that serves fixture repositories in the
//! hub's URL layout: the API's revision listing
//! (`/api/models/<org>/<name>/revision/<rev>?blobs=true`, sizes and hashes
//! computed from the bytes it serves) and the files
//! (`/<org>/<name>/resolve/<commit>/<path>`, with `Range` requests). It can
//! cut a file's body short or serve it corrupted. The binaries run with
//! `HF_ENDPOINT` pointing at it and `HF_HOME` in a temporary directory; no
//! part of the client is mocked.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};

use sha2::Digest;

use crate::common::{assert_fails, golden};

const COMMIT: &str = "5a7e1c0de0000000000000000000000000000001";

#[derive(Default)]
struct State {
    /// repo id -> (path -> bytes); files listed as LFS when they end in `.safetensors`.
    repos: HashMap<String, Vec<(String, Vec<u8>)>>,
    /// Send only this many bytes of the file, once, then close.
    cut: Option<(String, usize)>,
    /// Serve this file with one byte changed.
    corrupt: Option<String>,
    /// Every request: the request line, its Range and Authorization headers.
    log: Vec<(String, Option<String>, Option<String>)>,
}

struct Hub {
    url: String,
    state: Arc<Mutex<State>>,
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn git_sha1(b: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", b.len()).as_bytes());
    h.update(b);
    hex(&h.finalize())
}

impl Hub {
    fn start() -> Hub {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                let st = st.clone();
                std::thread::spawn(move || serve(c, &st));
            }
        });
        Hub { url, state }
    }

    fn add(&self, repo: &str, files: Vec<(String, Vec<u8>)>) {
        self.state.lock().unwrap().repos.insert(repo.into(), files);
    }

    /// The requests made for `path` under `/resolve/`, with their Range headers.
    fn fetches(&self, path: &str) -> Vec<Option<String>> {
        let suffix = format!("/{path} HTTP/1.1");
        self.state
            .lock()
            .unwrap()
            .log
            .iter()
            .filter(|(l, _, _)| l.contains("/resolve/") && l.ends_with(&suffix))
            .map(|(_, r, _)| r.clone())
            .collect()
    }
}

fn respond(c: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8], send: usize) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let _ = c.write_all(head.as_bytes());
    let _ = c.write_all(&body[..send.min(body.len())]);
    let _ = c.flush();
}

fn serve(mut c: TcpStream, st: &Mutex<State>) {
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    if r.read_line(&mut line).is_err() {
        return;
    }
    let line = line.trim_end().to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        match k.to_ascii_lowercase().as_str() {
            "range" => range = Some(v.trim().to_string()),
            "authorization" => auth = Some(v.trim().to_string()),
            _ => {}
        }
    }
    let mut s = st.lock().unwrap();
    s.log.push((line.clone(), range.clone(), auth));
    let target = line.split(' ').nth(1).unwrap_or("").to_string();
    // /api/models/<org>/<name>/revision/<rev>?blobs=true
    if let Some(rest) = target.strip_prefix("/api/models/") {
        let parts: Vec<&str> = rest.splitn(4, '/').collect();
        let repo = parts[..2.min(parts.len())].join("/");
        let ok_rev = parts
            .get(3)
            .is_some_and(|r| r.starts_with("main?") || r.starts_with(COMMIT));
        let Some(files) = s
            .repos
            .get(&repo)
            .filter(|_| ok_rev && parts[2] == "revision")
        else {
            return respond(
                &mut c,
                "404 Not Found",
                &[],
                b"{\"error\":\"Repository not found\"}",
                usize::MAX,
            );
        };
        let siblings: Vec<serde_json::Value> = files
            .iter()
            .map(|(p, b)| {
                if p.ends_with(".safetensors") {
                    serde_json::json!({"rfilename": p, "size": b.len(), "blobId": git_sha1(b),
                        "lfs": {"sha256": hex(&sha2::Sha256::digest(b)), "size": b.len(), "pointerSize": 134}})
                } else {
                    serde_json::json!({"rfilename": p, "size": b.len(), "blobId": git_sha1(b)})
                }
            })
            .collect();
        let body = serde_json::json!({"id": repo, "sha": COMMIT, "siblings": siblings}).to_string();
        return respond(
            &mut c,
            "200 OK",
            &[("Content-Type", "application/json".into())],
            body.as_bytes(),
            usize::MAX,
        );
    }
    // /<org>/<name>/resolve/<commit>/<path>
    let parts: Vec<&str> = target.trim_start_matches('/').splitn(5, '/').collect();
    let found = (parts.len() == 5 && parts[2] == "resolve" && parts[3] == COMMIT)
        .then(|| s.repos.get(&format!("{}/{}", parts[0], parts[1])))
        .flatten()
        .and_then(|files| files.iter().find(|(p, _)| p == parts[4]))
        .cloned();
    let Some((path, mut body)) = found else {
        return respond(&mut c, "404 Not Found", &[], b"Entry not found", usize::MAX);
    };
    if s.corrupt.as_deref() == Some(path.as_str()) {
        let mid = body.len() / 2;
        body[mid] ^= 0x5a;
    }
    let mut send = usize::MAX;
    if let Some((p, n)) = s.cut.clone()
        && p == path
    {
        s.cut = None;
        send = n;
    }
    drop(s);
    let from = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|r| r.parse::<usize>().ok());
    match from {
        Some(f) if f < body.len() => {
            let cr = format!("bytes {f}-{}/{}", body.len() - 1, body.len());
            respond(
                &mut c,
                "206 Partial Content",
                &[("Content-Range", cr)],
                &body[f..],
                send,
            )
        }
        Some(_) => respond(&mut c, "416 Range Not Satisfiable", &[], b"", usize::MAX),
        None => respond(&mut c, "200 OK", &[], &body, send),
    }
    let _ = c.shutdown(std::net::Shutdown::Both);
    let _ = r.read(&mut [0u8; 1]);
}

/// tiny-a with its weights as a pickle (`pytorch_model.bin`) only.
fn pickled_files() -> Vec<(String, Vec<u8>)> {
    let mut files = model_files("tiny-a");
    files.retain(|f| f.0 != "model.safetensors");
    files.push(("pytorch_model.bin".into(), b"\x80\x02pickle".to_vec()));
    files
}

fn model_files(name: &str) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(golden(&format!("models/{name}")))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// `ane-run preprocess --model <model>` with the hub settings given, on one image.
fn preprocess(model: &str, home: &Path, env: &[(&str, &str)]) -> Output {
    preprocess_at(model, "main", home, env)
}

fn preprocess_at(model: &str, revision: &str, home: &Path, env: &[(&str, &str)]) -> Output {
    let out = home.join("pixels.safetensors");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ane-run"));
    cmd.args([
        "preprocess",
        "--model",
        model,
        "--revision",
        revision,
        "--image",
    ])
    .arg(golden("images/tiny.png"))
    .arg("--out")
    .arg(&out);
    for k in ["HF_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT"] {
        cmd.env_remove(k);
    }
    cmd.env("HF_HOME", home);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "expected success:\n{err}");
    err
}

fn repo_dir(home: &Path, repo: &str) -> PathBuf {
    home.join("hub")
        .join(format!("models--{}", repo.replace('/', "--")))
}

/// Files under `dir` whose name ends with `suffix`.
fn with_suffix(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().path())
                .filter(|p| p.to_string_lossy().ends_with(suffix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn downloads_into_the_cache_layout_then_works_offline() {
    let hub = Hub::start();
    let files = model_files("tiny-a");
    hub.add("Org/Tiny", files.clone());
    let t = tempfile::tempdir().unwrap();
    let home = t.path();
    let env = [("HF_ENDPOINT", hub.url.as_str()), ("HF_TOKEN", "hf_secret")];
    let err = ok(&preprocess("Org/Tiny", home, &env));
    assert!(err.contains("downloading 4 file(s) of Org/Tiny"), "{err}");

    // huggingface_hub's layout: a ref, relative symlinks into content-named blobs.
    let dir = repo_dir(home, "Org/Tiny");
    assert_eq!(
        std::fs::read_to_string(dir.join("refs/main")).unwrap(),
        COMMIT
    );
    let snap = dir.join("snapshots").join(COMMIT);
    for (name, bytes) in &files {
        let link = snap.join(name);
        let target = std::fs::read_link(&link).unwrap();
        let etag = if name.ends_with(".safetensors") {
            hex(&sha2::Sha256::digest(bytes))
        } else {
            git_sha1(bytes)
        };
        assert_eq!(target, Path::new("../../blobs").join(&etag), "{name}");
        assert_eq!(&std::fs::read(&link).unwrap(), bytes, "{name}");
    }
    assert!(with_suffix(&dir.join("blobs"), ".incomplete").is_empty());
    // The token went to the API and to the files.
    let log = hub.state.lock().unwrap().log.clone();
    assert!(
        log.iter()
            .all(|(_, _, a)| a.as_deref() == Some("Bearer hf_secret")),
        "{log:?}"
    );

    // A second run asks the API for the revision and downloads nothing.
    ok(&preprocess("Org/Tiny", home, &env));
    assert_eq!(hub.fetches("model.safetensors").len(), 1);

    // Offline: no request at all, from the cache; by commit hash too.
    let n = hub.state.lock().unwrap().log.len();
    let offline = [("HF_ENDPOINT", hub.url.as_str()), ("HF_HUB_OFFLINE", "1")];
    ok(&preprocess("Org/Tiny", home, &offline));
    assert_eq!(
        hub.state.lock().unwrap().log.len(),
        n,
        "offline mode made a request"
    );
    // Unreachable hub with the revision cached: the cache, with a warning.
    let err = ok(&preprocess(
        "Org/Tiny",
        home,
        &[("HF_ENDPOINT", "http://127.0.0.1:9")],
    ));
    assert!(
        err.contains("cannot be reached") && err.contains("cached snapshot"),
        "{err}"
    );

    // Offline and not cached: an error that says why nothing was fetched.
    let o = preprocess("Org/Other", home, &offline);
    assert_fails(
        &o,
        &[
            "Org/Other",
            "not in the local Hugging Face cache",
            "HF_HUB_OFFLINE",
        ],
    );
    // Unreachable and not cached.
    let o = preprocess("Org/Other", home, &[("HF_ENDPOINT", "http://127.0.0.1:9")]);
    assert_fails(
        &o,
        &["Org/Other", "cannot reach the hub at http://127.0.0.1:9"],
    );
}

#[test]
fn resumes_a_partial_download() {
    let hub = Hub::start();
    let files = model_files("tiny-a");
    let weights = files
        .iter()
        .find(|f| f.0 == "model.safetensors")
        .unwrap()
        .1
        .clone();
    hub.add("Org/Tiny", files);
    hub.state.lock().unwrap().cut = Some(("model.safetensors".into(), 5000));
    let t = tempfile::tempdir().unwrap();
    let env = [("HF_ENDPOINT", hub.url.as_str())];
    let o = preprocess("Org/Tiny", t.path(), &env);
    assert_fails(&o, &["Org/Tiny/model.safetensors", "run again to resume"]);
    let blobs = repo_dir(t.path(), "Org/Tiny").join("blobs");
    let part = with_suffix(&blobs, ".incomplete");
    assert_eq!(part.len(), 1);
    assert_eq!(std::fs::metadata(&part[0]).unwrap().len(), 5000);
    assert!(!repo_dir(t.path(), "Org/Tiny").join("refs/main").exists());

    ok(&preprocess("Org/Tiny", t.path(), &env));
    assert_eq!(
        hub.fetches("model.safetensors"),
        [None, Some("bytes=5000-".to_string())]
    );
    let snap = repo_dir(t.path(), "Org/Tiny")
        .join("snapshots")
        .join(COMMIT);
    assert_eq!(
        std::fs::read(snap.join("model.safetensors")).unwrap(),
        weights
    );
    assert!(with_suffix(&blobs, ".incomplete").is_empty());
}

#[test]
fn a_corrupted_file_is_deleted_and_named() {
    let hub = Hub::start();
    hub.add("Org/Tiny", model_files("tiny-a"));
    hub.state.lock().unwrap().corrupt = Some("model.safetensors".into());
    let t = tempfile::tempdir().unwrap();
    let o = preprocess("Org/Tiny", t.path(), &[("HF_ENDPOINT", hub.url.as_str())]);
    assert_fails(
        &o,
        &[
            "Org/Tiny/model.safetensors",
            "corrupt and was deleted",
            "sha256",
        ],
    );
    let dir = repo_dir(t.path(), "Org/Tiny");
    let blobs = dir.join("blobs");
    assert!(with_suffix(&blobs, ".incomplete").is_empty());
    let etags: Vec<_> = with_suffix(&blobs, "")
        .into_iter()
        .filter(|p| p.extension().is_none())
        .collect();
    assert_eq!(
        etags.len(),
        3,
        "only the three good files are blobs: {etags:?}"
    );
    let snap = dir.join("snapshots").join(COMMIT);
    assert!(!snap.join("model.safetensors").exists());
    assert!(!dir.join("refs/main").exists());
}

#[test]
fn missing_repos_and_pickles_are_refused() {
    let hub = Hub::start();
    hub.add("Org/Pickled", pickled_files());
    let t = tempfile::tempdir().unwrap();
    let env = [("HF_ENDPOINT", hub.url.as_str())];
    let o = preprocess("Org/Missing", t.path(), &env);
    assert_fails(&o, &["Org/Missing", "is not on the hub", "404"]);
    let o = preprocess("Org/Pickled", t.path(), &env);
    assert_fails(&o, &["Org/Pickled", "pytorch_model.bin", "pickled"]);
    assert!(hub.fetches("pytorch_model.bin").is_empty());
    assert!(
        hub.fetches("config.json").is_empty(),
        "nothing is fetched from a refused repo"
    );
}

#[test]
fn a_sharded_checkpoint_downloads_its_index_and_shards() {
    let hub = Hub::start();
    let mut files = model_files("tiny-b");
    let single = files
        .iter()
        .position(|f| f.0 == "model.safetensors")
        .unwrap();
    let (_, bytes) = files.remove(single);
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let (a, b) = names.split_at(names.len() / 2);
    let mut map = serde_json::Map::new();
    for (i, part) in [a, b].into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let views: Vec<(String, safetensors::tensor::TensorView)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        files.push((file.clone(), safetensors::serialize(views, None).unwrap()));
        for n in part {
            map.insert(n.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map}).to_string();
    files.push(("model.safetensors.index.json".into(), index.into_bytes()));
    files.push(("unrelated.bin".into(), vec![0u8; 16]));
    hub.add("Org/Sharded", files);
    let t = tempfile::tempdir().unwrap();
    ok(&preprocess(
        "Org/Sharded",
        t.path(),
        &[("HF_ENDPOINT", hub.url.as_str())],
    ));
    let snap = repo_dir(t.path(), "Org/Sharded")
        .join("snapshots")
        .join(COMMIT);
    for f in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ] {
        assert!(snap.join(f).is_file(), "{f}");
    }
    assert!(
        hub.fetches("unrelated.bin").is_empty(),
        "a file ane-export does not read was fetched"
    );
}

/// The library's errors say which failure it was, so that a caller can act
/// (retry, ask for a token, refuse a pickled repo) without reading text.
#[test]
fn hub_failures_are_typed() {
    use ane_export::Error;
    use ane_export::checkpoint::hub::download::snapshot;
    use ane_export::checkpoint::hub::{HubError, HubSettings, RepoRef};

    let hub = Hub::start();
    hub.add("Org/Pickled", pickled_files());
    let mut config_only = model_files("tiny-a");
    config_only.retain(|f| f.0 != "model.safetensors");
    hub.add("Org/NoWeights", config_only);
    let t = tempfile::tempdir().unwrap();
    let settings = |endpoint: &str, token: Option<&str>| HubSettings {
        cache: t.path().join("hub"),
        endpoint: endpoint.to_string(),
        token: token.map(str::to_string),
        offline: false,
    };
    let s = settings(&hub.url, None);
    let get = |s: &HubSettings, repo: &str| {
        snapshot(
            s,
            &RepoRef::parse(repo, "main").unwrap(),
            &Default::default(),
        )
    };
    let hub_error = |r: ane_export::Result<std::path::PathBuf>| match r {
        Err(Error::Hub { what, error }) => (what, *error),
        other => panic!("expected a hub error, got {other:?}"),
    };
    match hub_error(get(&s, "Org/Missing")) {
        (what, HubError::NotFound { revision, .. }) => {
            assert_eq!((what.as_str(), revision.as_str()), ("Org/Missing", "main"))
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    match hub_error(get(&s, "Org/Pickled")) {
        (_, HubError::NoSafetensors { pickles, .. }) => assert_eq!(pickles, ["pytorch_model.bin"]),
        other => panic!("expected NoSafetensors, got {other:?}"),
    }
    match hub_error(get(&s, "Org/NoWeights")) {
        (_, HubError::NoSafetensors { pickles, .. }) => assert!(pickles.is_empty()),
        other => panic!("expected NoSafetensors, got {other:?}"),
    }
    // Nothing listens on port 9 of this machine's loopback: unreachable,
    // and not in the cache.
    match hub_error(get(&settings("http://127.0.0.1:9", None), "Org/Tiny")) {
        (_, HubError::Unreachable { revision, .. }) => assert_eq!(revision, "main"),
        other => panic!("expected Unreachable, got {other:?}"),
    }
}
