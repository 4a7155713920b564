"""Render the Helm chart with the real helm binary and check what an operator relies on.

Needs only PyYAML and network access on the first run (to fetch helm, see helm.py). Without helm the
tests are skipped locally and fail when CI is set.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "cronman"
RELEASE = "t"
NAMESPACE = "cronman"
FULLNAME = f"{RELEASE}-cronman"
HOOK_PHASES = "pre-install,pre-upgrade"

Doc = dict[str, Any]


def _load_helm_module() -> Any:
    # Loaded by path so the tests work whatever the package layout and pytest import mode.
    spec = importlib.util.spec_from_file_location("_cronman_chart_helm", Path(__file__).with_name("helm.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_helm = _load_helm_module()


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return cast(Path, _helm.helm_binary())
    except _helm.HelmUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"helm is required when CI is set: {exc}")
        pytest.skip(f"helm is not available: {exc}")


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60, check=False)


@functools.cache
def _render(helm: Path, sets: tuple[str, ...]) -> tuple[Doc, ...]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def render(helm: Path, *sets: str) -> list[Doc]:
    return list(_render(helm, sets))


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, got {[d['metadata']['name'] for d in find(docs, kind)]}"
    return found[0]


def pod_template(obj: Doc) -> Doc:
    spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    return cast(Doc, spec["template"])


def pod_spec(obj: Doc) -> Doc:
    return cast(Doc, pod_template(obj)["spec"])


def pod_labels(obj: Doc) -> dict[str, str]:
    return cast(dict[str, str], pod_template(obj)["metadata"]["labels"])


def pod_annotations(obj: Doc) -> dict[str, str]:
    return cast(dict[str, str], pod_template(obj)["metadata"]["annotations"])


def workloads(docs: list[Doc]) -> Iterator[Doc]:
    for d in docs:
        if d["kind"] in ("Deployment", "Job", "CronJob"):
            yield d


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def decoded(secret: Doc) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}


# ---- lint and the default render ----


def test_lint_strict_is_clean(helm: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


def test_default_render_is_valid_objects(helm: Path) -> None:
    docs = render(helm)
    seen = set()
    for d in docs:
        assert d.get("apiVersion") and d.get("kind"), d
        name = d["metadata"]["name"]
        assert name and len(name) <= 63, name
        assert (d["kind"], name) not in seen, f"duplicate {d['kind']} {name}"
        seen.add((d["kind"], name))
    expected = {
        ("Deployment", f"{FULLNAME}-api"),
        ("Deployment", f"{FULLNAME}-scheduler"),
        ("Service", f"{FULLNAME}-api"),
        ("Service", f"{FULLNAME}-scheduler"),
        ("ConfigMap", FULLNAME),
        ("Secret", FULLNAME),
        ("ServiceAccount", FULLNAME),
        ("PodDisruptionBudget", f"{FULLNAME}-scheduler"),
        ("Job", f"{FULLNAME}-migrate"),
        ("CronJob", f"{FULLNAME}-maintain"),
    }
    assert expected <= seen, expected - seen
    assert not find(docs, "Ingress") and not find(docs, "ServiceMonitor")


def test_deployments_run_the_right_commands_with_default_replicas(helm: Path) -> None:
    docs = render(helm)
    api = one(docs, "Deployment", f"{FULLNAME}-api")
    scheduler = one(docs, "Deployment", f"{FULLNAME}-scheduler")
    assert api["spec"]["replicas"] == 2
    assert scheduler["spec"]["replicas"] == 3
    assert pod_spec(api)["containers"][0]["args"] == ["api"]
    assert pod_spec(scheduler)["containers"][0]["args"] == ["scheduler"]
    for d in (api, scheduler):
        assert selects(d["spec"]["selector"]["matchLabels"], pod_labels(d))
    # The two Deployments must not select each other's pods.
    assert not selects(api["spec"]["selector"]["matchLabels"], pod_labels(scheduler))
    assert not selects(scheduler["spec"]["selector"]["matchLabels"], pod_labels(api))


@pytest.mark.parametrize(("component", "port_name", "port"), [("api", "http", 8080), ("scheduler", "metrics", 9090)])
def test_probes(helm: Path, component: str, port_name: str, port: int) -> None:
    container = pod_spec(one(render(helm), "Deployment", f"{FULLNAME}-{component}"))["containers"][0]
    assert {"name": port_name, "containerPort": port, "protocol": "TCP"} in container["ports"]
    liveness = container["livenessProbe"]["httpGet"]
    readiness = container["readinessProbe"]["httpGet"]
    assert (liveness["path"], liveness["port"]) == ("/healthz", port_name)
    assert (readiness["path"], readiness["port"]) == ("/readyz", port_name)


def test_image_defaults_to_app_version(helm: Path) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    for w in workloads(render(helm)):
        for c in pod_spec(w)["containers"]:
            assert c["image"] == f"ghcr.io/cronman/cronman:{app_version}"


def test_migrations_job_is_a_pre_install_and_pre_upgrade_hook(helm: Path) -> None:
    docs = render(helm)
    job = one(docs, "Job", f"{FULLNAME}-migrate")
    ann = job["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == HOOK_PHASES
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    spec = pod_spec(job)
    assert spec["containers"][0]["args"] == ["migrate"]
    assert spec["restartPolicy"] == "Never"
    # The chart's ServiceAccount does not exist yet when a pre-install hook runs.
    assert "serviceAccountName" not in spec
    # Its settings come from hook objects created before it (lower weight), not from the release's
    # ConfigMap/Secret, which do not exist yet on install.
    for ref in spec["containers"][0]["envFrom"]:
        kind, name = (
            ("ConfigMap", ref["configMapRef"]["name"])
            if "configMapRef" in ref
            else ("Secret", ref["secretRef"]["name"])
        )
        source = one(docs, kind, name)
        source_ann = source["metadata"].get("annotations", {})
        assert source_ann.get("helm.sh/hook") == HOOK_PHASES, f"{kind} {name} is not a hook"
        assert int(source_ann["helm.sh/hook-weight"]) < int(ann["helm.sh/hook-weight"])


def test_migrations_can_be_disabled(helm: Path) -> None:
    docs = render(helm, "migrations.enabled=false")
    assert not find(docs, "Job")
    assert not [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]


def test_scheduler_pdb_selects_only_scheduler_pods(helm: Path) -> None:
    docs = render(helm)
    pdb = one(docs, "PodDisruptionBudget", f"{FULLNAME}-scheduler")
    assert pdb["spec"]["maxUnavailable"] == 1
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selects(selector, pod_labels(one(docs, "Deployment", f"{FULLNAME}-scheduler")))
    assert not selects(selector, pod_labels(one(docs, "Deployment", f"{FULLNAME}-api")))


def test_termination_grace_exceeds_lease(helm: Path) -> None:
    docs = render(helm)
    lease = float(one(docs, "ConfigMap", FULLNAME)["data"]["CRONMAN_LEASE_SECONDS"])
    grace = pod_spec(one(docs, "Deployment", f"{FULLNAME}-scheduler"))["terminationGracePeriodSeconds"]
    assert lease == 5
    assert grace > lease


def test_grace_not_longer_than_lease_is_refused(helm: Path) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--set", "config.CRONMAN_LEASE_SECONDS=30")
    assert proc.returncode != 0
    assert "terminationGracePeriodSeconds" in proc.stderr


def test_scheduler_node_id_is_the_pod_name(helm: Path) -> None:
    container = pod_spec(one(render(helm), "Deployment", f"{FULLNAME}-scheduler"))["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["CRONMAN_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["CRONMAN_NODE_PORT"]["value"] == "9090"


def test_scheduler_spreads_across_nodes(helm: Path) -> None:
    deployment = one(render(helm), "Deployment", f"{FULLNAME}-scheduler")
    spec, labels = pod_spec(deployment), pod_labels(deployment)
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert selects(spread["labelSelector"]["matchLabels"], labels)
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["podAffinityTerm"]["labelSelector"]["matchLabels"], labels)


def test_maintenance_cronjob_runs_maintain(helm: Path) -> None:
    cronjob = one(render(helm), "CronJob", f"{FULLNAME}-maintain")
    assert cronjob["spec"]["schedule"] == "17 * * * *"
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    container = pod_spec(cronjob)["containers"][0]
    assert container["command"] + container["args"] == ["cronman", "maintain"]


def test_every_pod_gets_the_configmap_and_secret(helm: Path) -> None:
    docs = render(helm)
    for name in (f"{FULLNAME}-api", f"{FULLNAME}-scheduler"):
        refs = pod_spec(one(docs, "Deployment", name))["containers"][0]["envFrom"]
        assert {"configMapRef": {"name": FULLNAME}} in refs
        assert {"secretRef": {"name": FULLNAME}} in refs
    refs = pod_spec(one(docs, "CronJob", f"{FULLNAME}-maintain"))["containers"][0]["envFrom"]
    assert {"configMapRef": {"name": FULLNAME}} in refs and {"secretRef": {"name": FULLNAME}} in refs
    config = one(docs, "ConfigMap", FULLNAME)["data"]
    assert config["CRONMAN_LOG_LEVEL"] == "INFO"
    assert config["CRONMAN_HISTORY_RETENTION_DAYS"] == "45"
    assert config["CRONMAN_REPLICATION_FACTOR"] == "2"
    # the connections per receiver the chart sets are the program's own default
    from cronman.settings import Settings

    per_host = Settings.model_fields["http_connections_per_host"].default
    assert config["CRONMAN_HTTP_CONNECTIONS_PER_HOST"] == str(per_host)
    assert all(k.startswith("CRONMAN_") for k in config)
    # Nothing secret in the ConfigMap; empty URLs are left out of the Secret.
    assert not {"CRONMAN_DATABASE_URL", "CRONMAN_REDIS_URL", "CRONMAN_API_KEY"} & set(config)
    assert decoded(one(docs, "Secret", FULLNAME)) == {}


def test_secret_values(helm: Path) -> None:
    docs = render(
        helm,
        "database.url=postgresql://u:p@db:5432/cronman",
        "redis.url=redis://redis:6379/0",
        "auth.adminKey=k3y-0123456789abcdef",
    )
    expected = {
        "CRONMAN_DATABASE_URL": "postgresql://u:p@db:5432/cronman",
        "CRONMAN_REDIS_URL": "redis://redis:6379/0",
        "CRONMAN_API_KEY": "k3y-0123456789abcdef",
    }
    assert decoded(one(docs, "Secret", FULLNAME)) == expected
    assert decoded(one(docs, "Secret", f"{FULLNAME}-migrations")) == expected
    # Pods roll when the settings change.
    default_ann = pod_annotations(one(render(helm), "Deployment", f"{FULLNAME}-api"))
    changed_ann = pod_annotations(one(docs, "Deployment", f"{FULLNAME}-api"))
    assert default_ann["checksum/secret"] != changed_ann["checksum/secret"]


def test_containers_are_locked_down(helm: Path) -> None:
    for w in workloads(render(helm)):
        spec = pod_spec(w)
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]


def test_services_target_the_right_pods(helm: Path) -> None:
    docs = render(helm)
    api_svc = one(docs, "Service", f"{FULLNAME}-api")
    assert api_svc["spec"]["ports"][0]["targetPort"] == "http"
    assert selects(api_svc["spec"]["selector"], pod_labels(one(docs, "Deployment", f"{FULLNAME}-api")))
    sched_svc = one(docs, "Service", f"{FULLNAME}-scheduler")
    assert sched_svc["spec"]["ports"][0]["port"] == 9090
    assert sched_svc["spec"]["ports"][0]["name"] == "metrics"
    assert selects(sched_svc["spec"]["selector"], pod_labels(one(docs, "Deployment", f"{FULLNAME}-scheduler")))


# ---- custom values ----


def test_scheduler_replicas_can_be_raised(helm: Path) -> None:
    docs = render(helm, "scheduler.replicas=5")
    assert one(docs, "Deployment", f"{FULLNAME}-scheduler")["spec"]["replicas"] == 5


def test_existing_secret_replaces_the_chart_secret(helm: Path) -> None:
    docs = render(helm, "existingSecret=my-secret", "database.url=postgresql://ignored")
    assert not find(docs, "Secret")
    for w in workloads(docs):
        refs = pod_spec(w)["containers"][0]["envFrom"]
        assert {"secretRef": {"name": "my-secret"}} in refs, w["metadata"]["name"]


def test_ingress(helm: Path) -> None:
    docs = render(
        helm,
        "ingress.enabled=true",
        "ingress.className=nginx",
        "ingress.hosts[0].host=cron.example.com",
        "ingress.hosts[0].paths[0].path=/",
        "ingress.tls[0].secretName=cron-tls",
        "ingress.tls[0].hosts[0]=cron.example.com",
    )
    (ingress,) = find(docs, "Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["cron.example.com"], "secretName": "cron-tls"}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "cron.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": f"{FULLNAME}-api", "port": {"name": "http"}}


def test_tls_at_the_ingress_makes_the_cookie_secure_and_sends_hsts(helm: Path) -> None:
    def config(*sets: str) -> dict[str, str]:
        return cast(dict[str, str], one(render(helm, *sets), "ConfigMap", FULLNAME)["data"])

    assert "CRONMAN_UI_SECURE_COOKIE" not in config()
    assert "CRONMAN_UI_SECURE_COOKIE" not in config("ingress.enabled=true")  # plain HTTP
    tls = ("ingress.enabled=true", "ingress.tls[0].secretName=cron-tls", "ingress.tls[0].hosts[0]=cron.example.com")
    assert config(*tls)["CRONMAN_UI_SECURE_COOKIE"] == "true"
    assert config(*tls, "config.CRONMAN_UI_SECURE_COOKIE=false")["CRONMAN_UI_SECURE_COOKIE"] == "false"
    assert "CRONMAN_TRUSTED_PROXIES" not in config()
    proxies = config("api.trustedProxies={10.0.0.0/8,fd00::/8}")
    assert proxies["CRONMAN_TRUSTED_PROXIES"] == "10.0.0.0/8,fd00::/8"

    from cronman.settings import Settings

    env = {"ui_secure_cookie": config(*tls)["CRONMAN_UI_SECURE_COOKIE"], **config("api.trustedProxies={10.0.0.0/8}")}
    settings = Settings.model_validate({k.removeprefix("CRONMAN_").lower(): v for k, v in env.items()})
    assert settings.ui_secure_cookie and len(settings.trusted_networks) == 1 and settings.hsts_seconds > 0


def test_a_ca_for_verify_full_reaches_every_container(helm: Path) -> None:
    docs = render(
        helm,
        "database.hosts[0]=pg:5432",
        "database.params.sslmode=verify-full",
        "database.params.sslrootcert=/etc/cronman/pg-ca/ca.crt",
        "extraVolumes[0].name=pg-ca",
        "extraVolumes[0].secret.secretName=pg-ca",
        "extraVolumeMounts[0].name=pg-ca",
        "extraVolumeMounts[0].mountPath=/etc/cronman/pg-ca",
        "extraVolumeMounts[0].readOnly=true",
    )
    from urllib.parse import parse_qs, urlsplit

    url = decoded(one(docs, "Secret", FULLNAME))["CRONMAN_DATABASE_URL"]
    params = parse_qs(urlsplit(url).query)  # libpq decodes the escapes too
    assert params["sslmode"] == ["verify-full"] and params["sslrootcert"] == ["/etc/cronman/pg-ca/ca.crt"]
    for w in workloads(docs):
        spec = pod_spec(w)
        assert {"name": "pg-ca", "secret": {"secretName": "pg-ca"}} in spec["volumes"], w["metadata"]["name"]
        mounts = spec["containers"][0]["volumeMounts"]
        assert {"name": "pg-ca", "mountPath": "/etc/cronman/pg-ca", "readOnly": True} in mounts
        assert {"name": "tmp", "mountPath": "/tmp"} in mounts
    values = (CHART / "values.yaml").read_text() + (CHART / "README.md").read_text()
    assert not re.search(r"[?&]sslmode=require|sslmode: require", values)  # no example recommends it


def test_service_monitors(helm: Path) -> None:
    docs = render(helm, "serviceMonitor.enabled=true", "serviceMonitor.labels.release=prom")
    monitors = find(docs, "ServiceMonitor")
    assert len(monitors) == 2
    services = find(docs, "Service")
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "prom"
        (svc,) = [s for s in services if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
        assert endpoint["path"] == "/metrics"
    assert {m["metadata"]["name"] for m in monitors} == {f"{FULLNAME}-api", f"{FULLNAME}-scheduler"}


def test_service_account_annotations(helm: Path) -> None:
    arn = "arn:aws:iam::123456789012:role/cronman-sqs"
    docs = render(helm, f"serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn={arn}")
    sa = one(docs, "ServiceAccount", FULLNAME)
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": arn}
    for name in (f"{FULLNAME}-api", f"{FULLNAME}-scheduler"):
        assert pod_spec(one(docs, "Deployment", name))["serviceAccountName"] == FULLNAME


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("scheduler.replicas=abc", ("scheduler", "replicas")),
        ("scheduler.replicas=0", ("scheduler", "replicas")),
        ("api.replicas=0", ("api", "replicas")),
        ("config.LOG_LEVEL=DEBUG", ("LOG_LEVEL",)),
        ("auth.adminKey=too-short", ("adminKey",)),
    ],
)
def test_invalid_values_are_refused_by_the_schema(helm: Path, value: str, words: tuple[str, ...]) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--set", value)
    assert proc.returncode != 0, proc.stdout
    assert "schema" in proc.stderr, proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr


def test_notes_show_how_to_create_a_first_job(helm: Path) -> None:
    proc = run_helm(helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "/v1/jobs" in notes and "/v1/jobs/hello/executions" in notes
    assert "Authorization: Bearer $CRONMAN_API_KEY" in notes
    assert "Content-Type: application/json" in notes
    assert "WARNING" in notes  # no database/redis URL was given
    body = json.loads(notes.split("-d '", 1)[1].split("'", 1)[0])
    assert body == {
        "id": "hello",
        "schedule": {"type": "interval", "every_seconds": 60},
        "target": {"type": "http", "url": "https://example.com/hook"},
        "payload": {"hello": "world"},
    }


# ---- alignment with the program ----

# Read by the program outside the settings object (cronman.store.migrate.migrations_dir).
_EXTRA_CRONMAN_VARIABLES = {"CRONMAN_MIGRATIONS_DIR"}


def _settings_variables() -> set[str]:
    from cronman.settings import Settings

    return {f"CRONMAN_{name.upper()}" for name in Settings.model_fields} | _EXTRA_CRONMAN_VARIABLES


def test_every_cronman_variable_the_chart_sets_is_a_setting(helm: Path) -> None:
    docs = render(
        helm,
        "database.url=postgresql://u:p@db:5432/cronman",
        "redis.url=redis://redis:6379/0",
        "auth.adminKey=0123456789abcdef0123",
    )
    names: set[str] = set()
    for d in docs:
        if d["kind"] in ("ConfigMap", "Secret"):
            names |= set(d.get("data") or {})
    for w in workloads(docs):
        for c in pod_spec(w)["containers"]:
            names |= {e["name"] for e in c.get("env") or []}
    names |= set(yaml.safe_load((CHART / "values.yaml").read_text())["config"])
    cronman_names = {n for n in names if n.startswith("CRONMAN_")}
    assert {"CRONMAN_DATABASE_URL", "CRONMAN_REDIS_URL", "CRONMAN_API_KEY", "CRONMAN_NODE_ID"} <= cronman_names
    unknown = cronman_names - _settings_variables()
    assert not unknown, f"the chart sets variables the program does not read: {sorted(unknown)}"


@pytest.mark.parametrize(("component", "port_name"), [("api", "http"), ("scheduler", "metrics")])
def test_startup_probe_is_liveness(helm: Path, component: str, port_name: str) -> None:
    container = pod_spec(one(render(helm), "Deployment", f"{FULLNAME}-{component}"))["containers"][0]
    startup = container["startupProbe"]["httpGet"]
    assert (startup["path"], startup["port"]) == ("/healthz", port_name)


def test_api_metrics_directory_is_in_the_tmp_emptydir(helm: Path) -> None:
    """gunicorn workers share their series through PROMETHEUS_MULTIPROC_DIR; the root filesystem is
    read-only, so it must sit in the writable /tmp emptyDir."""
    spec = pod_spec(one(render(helm), "Deployment", f"{FULLNAME}-api"))
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    path = env["PROMETHEUS_MULTIPROC_DIR"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mount = next(p for p in sorted(mounts, key=len, reverse=True) if path == p or path.startswith(p.rstrip("/") + "/"))
    assert mount == "/tmp"
    assert "emptyDir" in volumes[mounts[mount]]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Only the API runs several worker processes.
    scheduler = pod_spec(one(render(helm), "Deployment", f"{FULLNAME}-scheduler"))["containers"][0]
    assert "PROMETHEUS_MULTIPROC_DIR" not in {e["name"] for e in scheduler["env"]}


def _series_names() -> set[str]:
    """Every sample name the node and the API can expose."""
    from prometheus_client import CollectorRegistry

    from api.metrics import api_metrics
    from scheduler_node.metrics import NodeMetrics

    names: set[str] = set()
    registries: list[Any] = [NodeMetrics("n").registry]
    api = api_metrics()
    api_registry = CollectorRegistry()
    for metric in (api.requests, api.latency, api.job_changes, api.validation_errors):
        api_registry.register(metric)
    registries.append(api_registry)
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            for suffix in ("_total", "_count", "_sum", "_bucket", "_created"):
                names.add(family.name + suffix)
    return names


def test_prometheus_rule_is_off_by_default_and_uses_existing_series(helm: Path) -> None:
    assert not find(render(helm), "PrometheusRule")
    docs = render(helm, "prometheusRule.enabled=true", "prometheusRule.labels.release=prom")
    (rule,) = find(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    alerts = {r["alert"] for r in rules}
    assert {
        "CronmanFireLagHigh",
        "CronmanPermanentFailures",
        "CronmanDuplicateDeliveries",
        "CronmanHistoryWritesFailing",
        "CronmanHeartbeatStale",
    } <= alerts
    known = _series_names()
    jobs = {f'job="{FULLNAME}-api"', f'job="{FULLNAME}-scheduler"'}
    for r in rules:
        used = set(re.findall(r"\bcronman_[a-z_]+", r["expr"]))
        assert used and used <= known, f"{r['alert']} uses unknown series {sorted(used - known)}"
        assert any(j in r["expr"] for j in jobs) and f'namespace="{NAMESPACE}"' in r["expr"], r["expr"]
        assert r["labels"]["severity"] in ("warning", "critical")
    # Each rule selects the Service a ServiceMonitor scrapes.
    services = {s["metadata"]["name"] for s in find(docs, "Service")}
    assert {j.split('"')[1] for j in jobs} <= services


# ---- Redis topologies and database URLs ----

SENTINEL_SETS = (
    "redis.mode=sentinel",
    "redis.url=rediss://mymaster/0",
    "redis.sentinel.sentinels={redis-node-0.redis-headless:26379,redis-node-1.redis-headless:26379}",
    "redis.sentinel.master=mymaster",
    "redis.sentinel.passwordSecret.name=redis",
    "redis.sentinel.passwordSecret.key=sentinel-password",
    "redis.passwordSecret.name=redis",
    "redis.passwordSecret.key=redis-password",
)
CLUSTER_SETS = (
    "redis.mode=cluster",
    "redis.seeds={rediss://redis-cluster-0.redis-cluster-headless:6379,rediss://redis-cluster-1.redis-cluster-headless:6379}",
    "redis.passwordSecret.name=redis-cluster",
    "redis.passwordSecret.key=redis-password",
)
MULTI_HOST_SETS = (
    "database.hosts={pg-a.db.svc:5432,pg-b.db.svc:5432}",
    "database.user=cron man",
    "database.params.sslmode=verify-full",
    "database.passwordSecret.name=pg",
    "database.passwordSecret.key=password",
)
SECRET_ENV = ("PGPASSWORD", "CRONMAN_REDIS_PASSWORD", "CRONMAN_REDIS_SENTINEL_PASSWORD")


def program_environment(docs: list[Doc], workload: Doc) -> dict[str, str]:
    """What the program sees in one workload's container: its envFrom sources and env, with a
    stand-in value for each variable read from a Secret outside the chart."""
    (container,) = pod_spec(workload)["containers"]
    env: dict[str, str] = {}
    for ref in container.get("envFrom") or []:
        if "configMapRef" in ref:
            env.update(one(docs, "ConfigMap", ref["configMapRef"]["name"]).get("data") or {})
        else:
            env.update(decoded(one(docs, "Secret", ref["secretRef"]["name"])))
    for e in container.get("env") or []:
        env[e["name"]] = e.get("value") or f"from-{e['valueFrom'].get('secretKeyRef', {}).get('name', 'field')}"
    return env


def program_settings(env: dict[str, str]) -> Any:
    """The program's settings, read from ``env`` alone."""
    from cronman.settings import Settings

    saved = {k: v for k, v in os.environ.items() if k.startswith("CRONMAN_")}
    for k in saved:
        del os.environ[k]
    os.environ.update({k: v for k, v in env.items() if k.startswith("CRONMAN_")})
    try:
        return Settings()
    finally:
        for k in [k for k in os.environ if k.startswith("CRONMAN_")]:
            del os.environ[k]
        os.environ.update(saved)


@pytest.mark.parametrize(
    ("sets", "described"),
    [
        (("redis.url=redis://redis-master:6379/0",), "redis standalone redis-master:6379"),
        (
            CLUSTER_SETS,
            "redis cluster tls redis-cluster-0.redis-cluster-headless:6379,redis-cluster-1.redis-cluster-headless:6379",
        ),
        (
            SENTINEL_SETS,
            "redis sentinel tls redis-node-0.redis-headless:26379,redis-node-1.redis-headless:26379 master=mymaster",
        ),
    ],
    ids=["standalone", "cluster", "sentinel"],
)
def test_each_redis_mode_renders_settings_the_program_accepts(
    helm: Path, sets: tuple[str, ...], described: str
) -> None:
    from cronman.redis.redisconn import topology

    docs = render(helm, "database.url=postgresql://u@db/cronman", *sets)
    for w in workloads(docs):
        settings = program_settings(program_environment(docs, w))
        assert topology(settings).describe() == described, w["metadata"]["name"]
    config = one(docs, "ConfigMap", FULLNAME)["data"]
    assert config["CRONMAN_REDIS_MODE"] == described.split()[1]


def test_passwords_come_from_existing_secrets_in_every_container(helm: Path) -> None:
    docs = render(helm, *SENTINEL_SETS, *MULTI_HOST_SETS)
    expected = {
        "PGPASSWORD": {"name": "pg", "key": "password"},
        "CRONMAN_REDIS_PASSWORD": {"name": "redis", "key": "redis-password"},
        "CRONMAN_REDIS_SENTINEL_PASSWORD": {"name": "redis", "key": "sentinel-password"},
    }
    for w in workloads(docs):
        (container,) = pod_spec(w)["containers"]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] in SECRET_ENV}
        assert refs == expected, w["metadata"]["name"]
    # None of them by default, and no password lands in the chart's own objects.
    for w in workloads(render(helm)):
        (container,) = pod_spec(w)["containers"]
        assert not {e["name"] for e in container.get("env") or []} & set(SECRET_ENV)


def test_a_multi_host_database_url_is_built_from_hosts(helm: Path) -> None:
    from cronman.store.store import engine_url

    docs = render(helm, *MULTI_HOST_SETS, "redis.url=redis://r:6379/0")
    url = decoded(one(docs, "Secret", FULLNAME))["CRONMAN_DATABASE_URL"]
    assert url == (
        "postgresql://cron+man@pg-a.db.svc:5432,pg-b.db.svc:5432/cronman"
        "?sslmode=verify-full&target_session_attrs=read-write"
    )
    assert decoded(one(docs, "Secret", f"{FULLNAME}-migrations"))["CRONMAN_DATABASE_URL"] == url
    assert engine_url(url).startswith(
        "postgresql+psycopg2://cron+man@/cronman?host=pg-a.db.svc,pg-b.db.svc&port=5432,5432"
    )
    # A URL given whole is kept as it is.
    given = "postgresql://u@a:5432,b:5433/db?target_session_attrs=read-write"
    escaped = given.replace(",", "\\,")  # --set splits on commas
    assert decoded(one(render(helm, f"database.url={escaped}"), "Secret", FULLNAME))["CRONMAN_DATABASE_URL"] == given


def test_notes_do_not_warn_for_a_sentinel_without_url_or_a_database_from_hosts(helm: Path) -> None:
    sets = [s for s in SENTINEL_SETS if not s.startswith("redis.url=")]
    args = ["install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    for s in (*sets, *MULTI_HOST_SETS):
        args += ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: the database" not in proc.stdout


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (("redis.mode=sentinel",), ("redis.sentinel.sentinels", "redis.sentinel.master")),
        (("redis.seeds={redis://a:6379}",), ("redis.seeds", "redis.mode=cluster")),
        (("database.url=postgresql://a/db", "database.hosts={b:5432}"), ("database.url", "database.hosts")),
        (("redis.mode=ring",), ("schema", "mode")),
        (("redis.passwordSecret.name=redis", "redis.passwordSecret.key="), ("schema", "key")),
        (("redis.seeds={http://a:1}", "redis.mode=cluster"), ("schema", "seeds")),
        (("database.hosts={a/b}",), ("schema", "hosts")),
    ],
)
def test_engine_values_that_cannot_work_are_refused(helm: Path, sets: tuple[str, ...], words: tuple[str, ...]) -> None:
    args = ["template", RELEASE, str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *args)
    assert proc.returncode != 0, proc.stdout
    assert all(w in proc.stderr for w in words), proc.stderr


# ---- every rendering: Kubernetes schemas and a security policy ----

VALUE_SETS: dict[str, tuple[str, ...]] = {
    "default": (),
    "sentinel-multihost": (*SENTINEL_SETS, *MULTI_HOST_SETS),
    "cluster": (*CLUSTER_SETS, "database.url=postgresql://u@db/cronman"),
    "everything-on": (
        "ingress.enabled=true",
        "ingress.tls[0].secretName=cron-tls",
        "ingress.tls[0].hosts[0]=cronman.local",
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "maintenance.timeZone=Europe/Paris",
        "scheduler.podAntiAffinityPreset=hard",
        "existingSecret=cronman-env",
        "extraEnv[0].name=EXTRA",
        "extraEnv[0].value=enabled",
    ),
    "minimal": ("migrations.enabled=false", "maintenance.enabled=false", "serviceAccount.create=false"),
}
# Custom resources of the Prometheus Operator: not in the Kubernetes schemas.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
# The oldest and the newest Kubernetes whose schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.28.0", "latest")


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_objects_match_the_kubernetes_schemas(helm: Path, name: str) -> None:
    import kubernetes_validate

    docs = render(helm, *VALUE_SETS[name])
    checked = 0
    for version in K8S_VERSIONS:
        version = kubernetes_validate.latest_version() if version == "latest" else version
        for d in docs:
            if d["kind"] in CUSTOM_KINDS:
                continue
            try:
                kubernetes_validate.validate(d, version, strict=True)  # strict: unknown fields are errors
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{d['kind']} {d['metadata']['name']} is not a valid Kubernetes {version} object: {exc}")
            checked += 1
    assert checked >= 2 * 5


def containers_of(w: Doc) -> list[Doc]:
    spec = pod_spec(w)
    return [*(spec.get("initContainers") or []), *spec["containers"]]


def policy_violations(docs: list[Doc]) -> list[str]:
    """The checks a policy scanner (checkov's Kubernetes rules) makes on a pod, written out: it runs
    as a non-root user, cannot gain privileges, has a read-only root filesystem and no added
    capabilities, stays off the host's namespaces and paths, has CPU and memory requests and limits,
    and names its image by a tag other than latest."""
    found: list[str] = []
    for w in workloads(docs):
        where = f"{w['kind']} {w['metadata']['name']}"
        spec = pod_spec(w)
        pod_sc = spec.get("securityContext") or {}
        checks = {
            "runAsNonRoot": pod_sc.get("runAsNonRoot") is True and pod_sc.get("runAsUser", 0) != 0,
            "seccomp profile": pod_sc.get("seccompProfile", {}).get("type") in ("RuntimeDefault", "Localhost"),
            "host namespaces": not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")),
            "hostPath volumes": not [v for v in spec.get("volumes") or [] if "hostPath" in v],
            "service account token": spec.get("automountServiceAccountToken") is False,
        }
        for c in containers_of(w):
            sc = c.get("securityContext") or {}
            caps = sc.get("capabilities") or {}
            resources = c.get("resources") or {}
            repository, _, tag = c["image"].rpartition(":")
            checks |= {
                f"{c['name']}: no privilege escalation": sc.get("allowPrivilegeEscalation") is False,
                f"{c['name']}: read-only root filesystem": sc.get("readOnlyRootFilesystem") is True,
                f"{c['name']}: not privileged": not sc.get("privileged"),
                f"{c['name']}: not root": sc.get("runAsUser", pod_sc.get("runAsUser", 0)) != 0,
                f"{c['name']}: capabilities dropped": caps.get("drop") == ["ALL"] and not caps.get("add"),
                f"{c['name']}: requests and limits": all(
                    {"cpu", "memory"} <= set(resources.get(k) or {}) for k in ("requests", "limits")
                ),
                f"{c['name']}: image tag": bool(repository) and bool(tag) and "/" not in tag and tag != "latest",
            }
        found += [f"{where}: {name}" for name, ok in checks.items() if not ok]
    return found


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_every_workload_meets_the_security_policy(helm: Path, name: str) -> None:
    assert policy_violations(render(helm, *VALUE_SETS[name])) == []


def test_the_policy_check_catches_a_weakened_pod(helm: Path) -> None:
    docs = render(
        helm,
        "securityContext.readOnlyRootFilesystem=false",
        "image.tag=latest",
        "scheduler.resources.limits=null",
        "podSecurityContext.runAsUser=0",
    )
    found = policy_violations(docs)
    scheduler = f"Deployment {FULLNAME}-scheduler"
    assert f"{scheduler}: scheduler: read-only root filesystem" in found
    assert f"{scheduler}: scheduler: image tag" in found
    assert f"{scheduler}: scheduler: requests and limits" in found
    assert f"{scheduler}: runAsNonRoot" in found
    assert f"Deployment {FULLNAME}-api: api: requests and limits" not in found
