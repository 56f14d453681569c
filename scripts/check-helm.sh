#!/usr/bin/env bash
# Renders deploy/helm/tessera with its default values and with each deploy/helm/tessera/ci/*.yaml,
# lints it, and validates every rendered manifest against the Kubernetes OpenAPI schemas.
#
# Tools come from PyPI into a venv under target/helm-check/ (reused on later runs):
#   helm-python-sdk      Helm v4's chart loader and template engine (Go, in the wheel), offline
#   kubernetes-validate  the Kubernetes JSON schemas and a validator (strict: unknown fields fail)
# ServiceMonitor is a CRD with no schema there; it is checked for its required fields.
#
# Usage: scripts/check-helm.sh [KUBERNETES_VERSION]   (default: the validator's newest)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/target/helm-check/venv"
python="${PYTHON:-python3}"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, yaml' 2>/dev/null; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    'helm-python-sdk==0.2.*' 'kubernetes-validate==1.*' 'pyyaml==6.*'
fi
exec "$venv/bin/python" - "$root/deploy/helm/tessera" "$root/target/helm-check/rendered" "${1:-}" <<'PY'
import pathlib
import sys

import helm_python
import kubernetes_validate
import yaml

chart_dir, out_dir, kube_version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
kube_version = kube_version or kubernetes_validate.latest_version()
chart = helm_python.Chart.load(str(chart_dir))
value_sets = {"default": {}}
for f in sorted((chart_dir / "ci").glob("*.yaml")):
    value_sets[f.stem] = yaml.safe_load(f.read_text()) or {}

failures = []
expected_kinds = {"default": {"Deployment", "Service"}}
for name, values in value_sets.items():
    report = helm_python.lint(str(chart_dir), values, strict=True)
    for m in report.get("messages", []):
        if m.get("severity", 0) >= 2:
            failures.append(f"{name}: lint: {m.get('path')}: {m.get('error')}")
    try:
        rendered = chart.render(values, name="tessera", namespace="default", is_install=True)
    except Exception as e:  # noqa: BLE001 - report every value set
        failures.append(f"{name}: render failed: {e}")
        continue
    target = out_dir / name
    target.mkdir(parents=True, exist_ok=True)
    kinds = set()
    for path, text in sorted(rendered.items()):
        if not path.endswith(".yaml") or not text.strip():
            continue
        (target / pathlib.Path(path).name).write_text(text)
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            kind = doc.get("kind")
            kinds.add(kind)
            where = f"{name}: {path} ({kind})"
            if kind == "ServiceMonitor":
                ok = (doc.get("apiVersion") == "monitoring.coreos.com/v1"
                      and doc["spec"]["selector"]["matchLabels"]
                      and all(e.get("port") and e.get("path") for e in doc["spec"]["endpoints"]))
                if not ok:
                    failures.append(f"{where}: incomplete ServiceMonitor")
                continue
            try:
                kubernetes_validate.validate(doc, kube_version, strict=True)
            except kubernetes_validate.ValidationError as e:
                failures.append(f"{where}: {'.'.join(map(str, e.path))}: {e.message}")
            except Exception as e:  # noqa: BLE001
                failures.append(f"{where}: {type(e).__name__}: {e}")
    missing = expected_kinds.get(name, set()) - kinds
    if missing:
        failures.append(f"{name}: missing {sorted(missing)}")
    print(f"{name}: rendered {', '.join(sorted(k for k in kinds if k))} -> {target}")

if failures:
    print("\n".join(["FAILED:"] + failures), file=sys.stderr)
    sys.exit(1)
print(f"helm chart: {len(value_sets)} value sets rendered and valid against Kubernetes {kube_version}")
PY
