#!/usr/bin/env bash
# Renders deploy/helm/tessera with its default values and with each deploy/helm/tessera/ci/*.yaml,
# lints it, and validates every rendered manifest against the Kubernetes OpenAPI schemas.
#
# Tools come from PyPI into a venv under target/helm-check/ (reused on later runs):
#   helm-python-sdk      Helm v4's chart loader and template engine (Go, in the wheel), offline
#   kubernetes-validate  the Kubernetes JSON schemas and a validator (strict: unknown fields fail)
#   jsonschema           validates the CRD objects against deploy/helm/crd-schemas/*.json (written
#                        from the upstream CRDs: InferencePool v1, LeaderWorkerSet v1)
# ServiceMonitor is a CRD with no schema there; it is checked for its required fields. A
# LeaderWorkerSet's pod templates are validated as core/v1 PodTemplates.
#
# Usage: scripts/check-helm.sh [KUBERNETES_VERSION]   (default: the validator's newest)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/target/helm-check/venv"
python="${PYTHON:-python3}"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, yaml' 2>/dev/null; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    'helm-python-sdk==0.2.*' 'kubernetes-validate==1.*' 'pyyaml==6.*' 'jsonschema==4.*'
fi
[[ "${TESSERA_INSTALL_ONLY:-}" == 1 ]] && exit 0
exec "$venv/bin/python" - "$root/deploy/helm/tessera" "$root/target/helm-check/rendered" "${1:-}" "$root/deploy/helm/crd-schemas" <<'PY'
import json
import pathlib
import sys

import helm_python
import jsonschema
import kubernetes_validate
import yaml

chart_dir, out_dir, kube_version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
kube_version = kube_version or kubernetes_validate.latest_version()
crd_schemas = {}
for f in sorted(pathlib.Path(sys.argv[4]).glob("*.json")):
    schema = json.loads(f.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    crd_schemas[(schema["properties"]["apiVersion"]["const"], schema["properties"]["kind"]["const"])] = schema


def validate_crd(doc, where):
    """Problems of a CRD object: its schema's errors, and its pod templates' (LeaderWorkerSet)."""
    schema = crd_schemas[(doc.get("apiVersion"), doc.get("kind"))]
    problems = [f"{where}: {'.'.join(map(str, e.path))}: {e.message}"
                for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    if doc.get("kind") == "LeaderWorkerSet":
        lwt = doc.get("spec", {}).get("leaderWorkerTemplate", {})
        for key in ("leaderTemplate", "workerTemplate"):
            if key not in lwt:
                continue
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": key.lower()}, "template": lwt[key]}
            try:
                kubernetes_validate.validate(pod_template, kube_version, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{where}: {key}.{'.'.join(map(str, e.path))}: {e.message}")
    return problems


def check_probes(doc, where):
    """The server container's probes: startup and readiness on /health, liveness on /live."""
    spec = doc["spec"]
    template = spec.get("template") or spec["leaderWorkerTemplate"]["leaderTemplate"]
    container = next(c for c in template["spec"]["containers"] if c["name"] == "tessera")
    paths = {p: container.get(p, {}).get("httpGet", {}).get("path")
             for p in ("startupProbe", "readinessProbe", "livenessProbe")}
    want = {"startupProbe": "/health", "readinessProbe": "/health", "livenessProbe": "/live"}
    return [] if paths == want else [f"{where}: probes {paths}, expected {want}"]
chart = helm_python.Chart.load(str(chart_dir))
value_sets = {"default": {}}
for f in sorted((chart_dir / "ci").glob("*.yaml")):
    value_sets[f.stem] = yaml.safe_load(f.read_text()) or {}

failures = []
expected_kinds = {
    "default": {"Deployment", "Service", "PodDisruptionBudget"},
    "gateway-values": {"InferencePool", "LeaderWorkerSet", "Deployment", "Service", "ServiceAccount",
                       "Role", "RoleBinding", "ConfigMap", "PodDisruptionBudget",
                       "HorizontalPodAutoscaler"},
}
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
            if (doc.get("apiVersion"), kind) in crd_schemas:
                failures.extend(validate_crd(doc, where))
                if kind == "LeaderWorkerSet":
                    failures.extend(check_probes(doc, where))
                continue
            if kind == "Deployment" and doc["metadata"]["name"] == "tessera":
                failures.extend(check_probes(doc, where))
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
