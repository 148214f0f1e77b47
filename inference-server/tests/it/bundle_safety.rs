//! The real `inference-server` binary against hostile or broken bundles dropped into its models
//! directory while it serves: a FIFO as a model file, symlinks out of the models directory, files
//! changed after sealing, and files that would exhaust memory. Each time the good bundle keeps
//! serving, every route keeps answering promptly, and the bad bundle is listed as rejected with a
//! reason.

use lifetime_model::bundle::{FEATURE_STORE_FILE, MULTICLASS_MODEL_FILE, REMAINING_MODEL_FILE};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use test_support::process::{rss_kib, with_config, Process};

/// How long any route may take while a bad bundle sits in the models directory.
const PROMPT: Duration = Duration::from_secs(10);

fn default_bundle() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/default")
}

/// Copies the default bundle into `dir` (created), all files regular.
fn copy_default(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    lifetime_model::bundle::copy_bundle(&default_bundle(), dir).unwrap();
}

/// A copy of the default bundle staged outside the models directory, changed by `change`, then
/// renamed into the models directory as `name` (whole, the way bundles are rolled out).
fn drop_in(root: &Path, name: &str, change: impl FnOnce(&Path)) {
    let staging = root.join(format!("staging-{name}"));
    copy_default(&staging);
    change(&staging);
    std::fs::rename(&staging, root.join("models").join(name)).unwrap();
}

/// The server, killed when dropped, and a client that gives up after [`PROMPT`].
struct Server {
    process: Process,
    client: reqwest::Client,
}

/// A temporary root holding `models/good` (the default bundle, stable by the rollout file, since
/// the bundles the tests add are copies of it too) and a server on it, ready.
async fn start() -> (tempfile::TempDir, Server) {
    let root = tempfile::tempdir().unwrap();
    let models = root.path().join("models");
    copy_default(&models.join("good"));
    std::fs::write(models.join("rollout.toml"), "stable = \"good\"\n").unwrap();
    let config = root.path().join("server.toml");
    let spawn = |port: u16| {
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\nmodels_dir = \"{}\"\nwatch_interval_ms = 100\nbundle_load_timeout_ms = 2000\n",
                models.display()
            ),
        )
        .unwrap();
        with_config(&mut Command::new(env!("CARGO_BIN_EXE_inference-server")), &config).spawn().unwrap()
    };
    let client = reqwest::Client::builder().timeout(PROMPT).build().unwrap();
    let process = Process::start("the server", Duration::from_secs(30), spawn).await;
    (root, Server { process, client })
}

impl Server {
    async fn models(&self) -> Vec<Value> {
        // The client gives up after PROMPT: an answer at all means no handler waited on a bundle.
        let list = self.client.get(format!("{}/v1/models", self.process.base)).send().await;
        let list: Value = list.expect("GET /v1/models answers promptly").json().await.unwrap();
        list.as_array().expect("a list").clone()
    }

    /// The status of `bundle` once the watcher has decided on it (not `loading`).
    async fn decided(&self, bundle: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let list = self.models().await;
            if let Some(status) = list.iter().find(|s| s["bundle"] == bundle && s["state"] != "loading") {
                return status.clone();
            }
            assert!(Instant::now() < deadline, "{bundle} was never decided on: {list:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn rejection_reason(&self, bundle: &str) -> String {
        let status = self.decided(bundle).await;
        assert_eq!(status["state"], "rejected", "{status}");
        status["reason"].as_str().expect("a reason").to_owned()
    }

    /// `/healthz`, `/readyz`, `/v1/models` and `/v1/predict` all answer within [`PROMPT`], and
    /// predictions come from the good bundle.
    async fn answers_promptly(&self) {
        for route in ["/healthz", "/readyz"] {
            let response = self.client.get(format!("{}{route}", self.process.base)).send().await;
            assert_eq!(response.unwrap_or_else(|e| panic!("{route}: {e}")).status(), 200, "{route}");
        }
        let states: Vec<(String, String)> = self
            .models()
            .await
            .iter()
            .map(|s| (s["bundle"].as_str().unwrap().to_owned(), s["state"].as_str().unwrap().to_owned()))
            .collect();
        assert!(states.contains(&("good".to_owned(), "stable".to_owned())), "{states:?}");
        let instance = json!({"key": "vm-1", "tenant_id": "t3", "vm_type": "D2", "cores": 2, "memory_gib": 8});
        let response = self
            .client
            .post(format!("{}/v1/predict", self.process.base))
            .json(&json!({"instances": [instance]}))
            .send()
            .await
            .expect("POST /v1/predict answers promptly");
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["predictions"][0]["model_version"], "default-1");
    }

    /// Resident memory of the server, from `/proc/<pid>/status`.
    fn rss_bytes(&self) -> u64 {
        rss_kib(self.process.id().expect("the server runs")).expect("a VmRSS line") * 1024
    }
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// A bundle whose interval model is a FIFO (nobody ever writes to it) is refused at once, and while
/// it sits in the models directory every route answers and the good bundle serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_a_bundle_stalls_nothing() {
    let (root, server) = start().await;
    drop_in(root.path(), "fifo", |dir| {
        std::fs::remove_file(dir.join(MULTICLASS_MODEL_FILE)).unwrap();
        mkfifo(&dir.join(MULTICLASS_MODEL_FILE));
    });
    // Several watch intervals with the FIFO in place: each scan meets it again.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        server.answers_promptly().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reason = server.rejection_reason("fifo").await;
    assert!(reason.contains(MULTICLASS_MODEL_FILE) && reason.contains("FIFO"), "{reason}");

    // Later scans still work for other bundles.
    drop_in(root.path(), "later", |_| {});
    assert_ne!(server.decided("later").await["state"], "rejected");
    server.answers_promptly().await;
}

/// A bundle file that is a symlink out of the models directory is refused, even when the file it
/// points to is intact; a symlink that stays inside the models directory is followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_out_of_the_models_directory_are_refused() {
    let (root, server) = start().await;
    let outside = root.path().join("outside");
    copy_default(&outside);
    drop_in(root.path(), "escape", |dir| {
        std::fs::remove_file(dir.join(FEATURE_STORE_FILE)).unwrap();
        std::os::unix::fs::symlink(outside.join(FEATURE_STORE_FILE), dir.join(FEATURE_STORE_FILE)).unwrap();
    });
    let reason = server.rejection_reason("escape").await;
    assert!(reason.contains(FEATURE_STORE_FILE) && reason.contains("outside"), "{reason}");

    // A whole bundle directory linked in from outside is refused the same way.
    std::os::unix::fs::symlink(&outside, root.path().join("models").join("linked-dir")).unwrap();
    let reason = server.rejection_reason("linked-dir").await;
    assert!(reason.contains("outside"), "{reason}");

    let models = root.path().join("models");
    drop_in(root.path(), "shared", |dir| {
        std::fs::remove_file(dir.join(FEATURE_STORE_FILE)).unwrap();
        std::os::unix::fs::symlink(models.join("good").join(FEATURE_STORE_FILE), dir.join(FEATURE_STORE_FILE)).unwrap();
    });
    let status = server.decided("shared").await;
    assert_ne!(status["state"], "rejected", "{status}");
    server.answers_promptly().await;
}

/// Files changed after the bundle was sealed: the interval model (which the probe predictions do
/// not cover) and the feature store. Both bundles are refused naming the file; an intact copy loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundles_changed_after_sealing_are_refused() {
    let (root, server) = start().await;
    drop_in(root.path(), "changed-interval", |dir| {
        let path = dir.join(MULTICLASS_MODEL_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        // One leaf value of the first tree set to 0: still a valid model, different predictions.
        let start = text.find("\nleaf_value=").expect("a tree") + "\nleaf_value=".len();
        let end = start + text[start..].find([' ', '\n']).unwrap();
        assert_ne!(&text[start..end], "0");
        std::fs::write(&path, format!("{}0{}", &text[..start], &text[end..])).unwrap();
    });
    drop_in(root.path(), "changed-store", |dir| {
        let path = dir.join(FEATURE_STORE_FILE);
        let mut store: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        store["as_of_s"] = json!(store["as_of_s"].as_f64().expect("as_of_s") + 86_400.0);
        std::fs::write(&path, serde_json::to_vec(&store).unwrap()).unwrap();
    });
    drop_in(root.path(), "intact", |_| {});

    for (bundle, file) in [("changed-interval", MULTICLASS_MODEL_FILE), ("changed-store", FEATURE_STORE_FILE)] {
        let reason = server.rejection_reason(bundle).await;
        assert!(reason.contains(file) && reason.contains("SHA-256"), "{bundle}: {reason}");
    }
    let intact = server.decided("intact").await;
    assert!(intact["state"] == "stable" || intact["state"] == "available", "{intact}");
    assert_eq!(intact["version"], "default-1");
}

/// A model file linked to `/dev/zero`, and one far over the size limit, are refused without the
/// server reading them into memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_and_oversized_files_are_refused_without_growing_memory() {
    let (root, server) = start().await;
    let before = server.rss_bytes();
    drop_in(root.path(), "zero", |dir| {
        std::fs::remove_file(dir.join(REMAINING_MODEL_FILE)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.join(REMAINING_MODEL_FILE)).unwrap();
    });
    drop_in(root.path(), "huge", |dir| {
        // Sparse: 4 GiB that take no disk, well over the default 256 MiB limit.
        std::fs::OpenOptions::new().write(true).open(dir.join(REMAINING_MODEL_FILE)).unwrap().set_len(4 << 30).unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut peak = before;
    let mut decided = 0;
    while decided < 2 {
        peak = peak.max(server.rss_bytes());
        // Stop long before a runaway read could hurt the machine.
        assert!(peak < before + (200 << 20), "the server grew from {before} to {peak} bytes");
        let list = server.models().await;
        decided = ["zero", "huge"]
            .iter()
            .filter(|bundle| list.iter().any(|s| s["bundle"] == **bundle && s["state"] == "rejected"))
            .count();
        assert!(Instant::now() < deadline, "not both refused: {list:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let zero = server.rejection_reason("zero").await;
    assert!(zero.contains(REMAINING_MODEL_FILE) && zero.contains("outside"), "{zero}");
    let huge = server.rejection_reason("huge").await;
    assert!(huge.contains(REMAINING_MODEL_FILE) && huge.contains("larger than the limit"), "{huge}");
    server.answers_promptly().await;
    let after = server.rss_bytes();
    eprintln!("server RSS {before} bytes before, {peak} at most while refusing, {after} after");
    assert!(after < before + (64 << 20), "the server grew from {before} to {after} bytes");
}
