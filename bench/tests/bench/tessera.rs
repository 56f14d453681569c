//! `tessera-bench` against a real Tessera server (`tessera-launcher` on the tiny Llama
//! fixture, 127.0.0.1 only). Needs the workspace binaries built in the same profile
//! (`cargo build --workspace --bins`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_bench::BenchReport;

/// How long the launcher may take to become healthy.
const STARTUP: Duration = Duration::from_secs(90);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ is in the workspace")
        .to_path_buf()
}

/// `target/<profile>/`, where the workspace binaries are.
fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let mut dir = exe.parent().expect("its folder").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the binaries first with `cargo build --workspace --bins` (same \
         profile as the tests)",
        path.display()
    );
    path
}

/// A launcher on 127.0.0.1, killed (with its children, through their parent-death signal)
/// when dropped.
struct Launcher {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Launcher {
    fn start(model: &Path) -> Launcher {
        for name in ["tessera-shard", "tessera-router"] {
            binary(name);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let log = dir.path().join("launcher.log");
        let out = std::fs::File::create(&log).expect("log");
        let child = Command::new(binary("tessera-launcher"))
            .arg("--model-id")
            .arg(model)
            .args(["--hostname", "127.0.0.1", "--port", &port.to_string()])
            .arg("--shard-uds-path")
            .arg(dir.path().join("s"))
            .args(["--kv-cache-memory", "64M", "--shutdown-grace-period", "5"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start tessera-launcher");
        let mut launcher = Launcher {
            child,
            port,
            log,
            _dir: dir,
        };
        launcher.wait_healthy();
        launcher
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + STARTUP;
        let addr = format!("127.0.0.1:{}", self.port);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the launcher exited with {status}:\n{}", self.log_text());
            }
            if health_ok(&addr) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not healthy after {STARTUP:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /health` answers 200 (a bare HTTP/1.1 request, to keep this test synchronous).
fn health_ok(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

fn bench(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-bench"))
        .args(args)
        .output()
        .expect("run tessera-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn benchmarks_a_real_tessera_server() {
    let fixture = workspace().join("fixtures/tiny-llama");
    let server = Launcher::start(&fixture);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.json");
    let url = server.url();
    let tok = fixture.to_str().expect("utf-8 path");

    // Completions: synthetic prompts of exactly 16 tokens, exactly 8 output tokens.
    let (stdout, _) = bench(&[
        "--url",
        &url,
        "--tokenizer",
        tok,
        "--input-len",
        "16",
        "--output-len",
        "8",
        "-n",
        "8",
        "--concurrency",
        "4",
        "--ignore-eos",
        "--warmup",
        "1",
        "--no-progress",
        "--json",
        json.to_str().expect("utf-8"),
    ]);
    assert!(stdout.contains("Successful requests"), "{stdout}");
    let report = BenchReport::load(&json).expect("report");
    let run = &report.runs[0];
    assert_eq!(
        (run.metrics.completed, run.metrics.failed),
        (8, 0),
        "{stdout}"
    );
    assert_eq!(run.metrics.total_output_tokens, 64);
    assert_eq!(run.metrics.total_input_tokens, 128);
    assert_eq!(run.metrics.usage_missing, 0);
    for r in &run.requests {
        let usage = r.usage.expect("Tessera sends usage");
        assert_eq!(
            usage.prompt_tokens, 16,
            "server's count of the synthetic prompt"
        );
        assert_eq!(r.expected_prompt_tokens, Some(16));
        assert_eq!(
            usage.completion_tokens, 8,
            "ignore_eos generates max_tokens"
        );
        assert_eq!(r.finish_reason.as_deref(), Some("length"));
        let ttft = r.ttft_s.expect("ttft");
        assert!(ttft > 0.0 && ttft <= r.latency_s);
        assert!(!r.itl_s.is_empty() && r.itl_s.len() < 8);
    }
    let tpot = run.metrics.tpot_ms.expect("tpot");
    assert_eq!(tpot.count, 8);

    // Chat, as a sweep: the chat template adds tokens around the prompt.
    let (stdout, _) = bench(&[
        "--url",
        &url,
        "--tokenizer",
        tok,
        "--endpoint",
        "chat",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "-n",
        "4",
        "--sweep",
        "1,2",
        "--ignore-eos",
        "--no-progress",
        "--json",
        json.to_str().expect("utf-8"),
    ]);
    assert!(stdout.contains("c=2"), "{stdout}");
    let report = BenchReport::load(&json).expect("report");
    assert_eq!(report.runs.len(), 2);
    for run in &report.runs {
        assert_eq!(run.metrics.completed, 4, "{stdout}");
        assert_eq!(run.metrics.total_output_tokens, 16);
        assert!(run.requests.iter().all(|r| r.prompt_tokens() > 16));
    }
}
