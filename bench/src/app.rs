//! The command's flow: compare, or prepare requests, warm up, run (or sweep), report.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use tessera_bench::client::http_client;
use tessera_bench::report::{plan_label, render_compare, render_run, render_sweep};
use tessera_bench::{
    BenchReport, LoadPlan, ReportConfig, RequestSpec, RunMetrics, RunReport, Target, plot, prompts,
    runner,
};

use crate::args::Args;

/// Default `max_tokens` when neither the flag nor the dataset says.
const DEFAULT_OUTPUT_LEN: u32 = 128;

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    if let [a, b] = args.compare.as_slice() {
        return compare(a, b);
    }
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        bail!("--timeout must be a positive number of seconds");
    }
    if args.sweep.contains(&0) || args.concurrency == Some(0) {
        bail!("concurrency levels must be at least 1");
    }
    let specs = requests(&args)?;
    let max_level = args
        .sweep
        .iter()
        .copied()
        .chain(args.concurrency)
        .max()
        .unwrap_or(args.num_requests);
    let client = http_client(Duration::from_secs_f64(args.timeout), max_level.max(1))?;
    let target = target(&args, &client).await?;
    let plans: Vec<LoadPlan> = if args.sweep.is_empty() {
        vec![plan(&args, args.concurrency)]
    } else {
        args.sweep.iter().map(|c| plan(&args, Some(*c))).collect()
    };
    let started_at_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if args.warmup > 0 {
        warm_up(&client, &target, &specs, &plans[0], args.warmup).await;
    }
    let mut runs = Vec::new();
    for plan in &plans {
        runs.push(run_plan(&client, &target, &specs, plan, args.no_progress).await);
    }
    if runs.len() > 1 {
        print!("{}", render_sweep(&runs));
    }
    let report = BenchReport {
        tool: format!("tessera-bench {}", env!("CARGO_PKG_VERSION")),
        started_at_unix,
        config: report_config(&args, target.model),
        runs,
    };
    save(&args, &report)?;
    if report.runs.iter().any(|r| r.metrics.completed == 0) {
        bail!("no request succeeded in at least one run (see the errors above)");
    }
    Ok(())
}

/// Prints the comparison of two saved reports.
fn compare(a: &Path, b: &Path) -> anyhow::Result<()> {
    let ra = BenchReport::load(a)?;
    let rb = BenchReport::load(b)?;
    print!(
        "{}",
        render_compare(&ra, &rb, &a.display().to_string(), &b.display().to_string())
    );
    Ok(())
}

/// The server, model and request options every request of the run uses.
async fn target(args: &Args, client: &reqwest::Client) -> anyhow::Result<Target> {
    let model = match &args.model {
        Some(m) => m.clone(),
        None => discover_model(client, &args.url, args.api_key.as_deref()).await?,
    };
    let extra_body = match &args.extra_body {
        Some(text) => match serde_json::from_str(text).context("--extra-body")? {
            serde_json::Value::Object(map) => map,
            _ => bail!("--extra-body must be a JSON object"),
        },
        None => serde_json::Map::new(),
    };
    Ok(Target {
        base_url: args.url.clone(),
        endpoint: args.endpoint,
        model,
        api_key: args.api_key.clone(),
        ignore_eos: args.ignore_eos,
        temperature: args.temperature,
        extra_body,
    })
}

/// Sends every request under one load plan and prints its report.
async fn run_plan(
    client: &reqwest::Client,
    target: &Target,
    specs: &[RequestSpec],
    plan: &LoadPlan,
    no_progress: bool,
) -> RunReport {
    let label = plan_label(plan);
    let progress = progress_bar(specs.len(), &label, no_progress);
    let out = runner::run(client, target, specs, plan, &progress).await;
    progress.finish_and_clear();
    let run = RunReport {
        label,
        plan: *plan,
        metrics: RunMetrics::compute(&out.records, out.duration_s),
        requests: out.records,
    };
    println!("{}", render_run(&run));
    print_first_errors(&run);
    run
}

/// The options the report records.
fn report_config(args: &Args, model: String) -> ReportConfig {
    ReportConfig {
        url: args.url.clone(),
        model,
        endpoint: args.endpoint,
        num_requests: args.num_requests,
        input_len: args.dataset.is_none().then_some(args.input_len),
        output_len: args
            .output_len
            .or(args.dataset.is_none().then_some(DEFAULT_OUTPUT_LEN)),
        range_ratio: args.range_ratio,
        dataset: args.dataset.as_ref().map(|p| p.display().to_string()),
        tokenizer: args.tokenizer.as_ref().map(|p| p.display().to_string()),
        seed: args.seed,
        warmup: args.warmup,
        ignore_eos: args.ignore_eos,
        temperature: args.temperature,
    }
}

/// Writes the JSON report and the plot where the flags ask.
fn save(args: &Args, report: &BenchReport) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        report.save(path)?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::render_svg(report))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn plan(args: &Args, concurrency: Option<usize>) -> LoadPlan {
    LoadPlan {
        concurrency,
        request_rate: args.request_rate.filter(|r| r.is_finite() && *r > 0.0),
        burstiness: args.burstiness,
        seed: args.seed,
    }
}

fn requests(args: &Args) -> anyhow::Result<Vec<RequestSpec>> {
    let tokenizer = match &args.tokenizer {
        Some(path) => Some(
            prompts::load_tokenizer(path)
                .with_context(|| format!("--tokenizer {}", path.display()))?,
        ),
        None => None,
    };
    if let Some(path) = &args.dataset {
        return Ok(prompts::from_dataset(
            path,
            tokenizer.as_ref(),
            args.num_requests,
            DEFAULT_OUTPUT_LEN,
            args.output_len,
            args.seed,
        )?);
    }
    let Some(tokenizer) = &tokenizer else {
        bail!(
            "synthetic prompts of exact token lengths need the model's tokenizer: pass \
             --tokenizer (a model directory, tokenizer.json or .gguf), or use --dataset"
        );
    };
    if !(0.0..1.0).contains(&args.range_ratio) {
        bail!("--range-ratio must be in [0, 1)");
    }
    Ok(prompts::synthetic(
        tokenizer,
        args.num_requests,
        args.input_len,
        args.output_len.unwrap_or(DEFAULT_OUTPUT_LEN) as usize,
        args.range_ratio,
        args.seed,
    )?)
}

/// The first model id `GET /v1/models` lists.
async fn discover_model(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
) -> anyhow::Result<String> {
    let base = url.trim_end_matches('/');
    let base = base.strip_suffix("/v1").unwrap_or(base);
    let mut request = client.get(format!("{base}/v1/models"));
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let value: serde_json::Value = request
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .context("GET /v1/models (pass --model to skip it)")?
        .json()
        .await
        .context("GET /v1/models answered non-JSON (pass --model)")?;
    value["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .context("GET /v1/models listed no model (pass --model)")
}

/// Sends `count` requests (cycling over the prompts) at the first plan's concurrency;
/// their results are discarded, their failures reported.
async fn warm_up(
    client: &reqwest::Client,
    target: &Target,
    specs: &[RequestSpec],
    plan: &LoadPlan,
    count: usize,
) {
    let warm: Vec<RequestSpec> = specs.iter().cycle().take(count).cloned().collect();
    let warm_plan = LoadPlan {
        request_rate: None,
        ..*plan
    };
    let out = runner::run(client, target, &warm, &warm_plan, &ProgressBar::hidden()).await;
    let failed = out.records.iter().filter(|r| !r.ok()).count();
    if failed > 0 {
        eprintln!("warning: {failed} of {count} warm-up requests failed");
    }
}

fn progress_bar(len: usize, label: &str, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>10} [{elapsed_precise}] {wide_bar} {pos}/{len} {per_sec} {msg}",
    ) {
        bar.set_style(style);
    }
    bar.set_prefix(label.to_string());
    bar
}

/// One example message per error key, so failures are never silent.
fn print_first_errors(run: &RunReport) {
    let mut shown = std::collections::BTreeSet::new();
    for error in run.requests.iter().filter_map(|r| r.error.as_ref()) {
        if shown.insert(error.key()) {
            eprintln!("first {} error: {}", error.key(), error.message);
        }
    }
}
