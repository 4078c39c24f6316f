"""deploy/kubernetes, checked offline: no cluster, no kubectl, no image (README.md there says
what only a real cluster can show).

- every document parses, and yamllint passes with deploy/kubernetes/.yamllint;
- npm's kubernetes-models validates each object against its bundled OpenAPI schemas, and a
  strict walk over the same schemas finds no key they do not know (validate() alone accepts
  unknown keys: the test proves the walk catches one);
- each security field of both gateway profiles, the seccomp profile, the probes, requests ==
  limits, the PDB and PriorityClass, the node tag's source, and the router's ConfigMap equal
  to what deploy/haproxy/cellgate-haproxy writes now.
"""

import copy
import glob
import json
import os
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "kubernetes")
GENERATOR = os.path.join(ROOT, "deploy", "haproxy", "cellgate-haproxy")
VALIDATOR = os.path.join(ROOT, "tests", "scaleout", "validate-manifests.mjs")
NODE_MODULES = os.path.join(ROOT, "tests", "js", "node_modules")

# The router's ConfigMap is this command's output, byte for byte.
CONFIGMAP_ARGS = [
    "--nodes", "16",
    "--server-template", "cellgate-{n}.cellgate.cellgate.svc.cluster.local", "--resolv-conf",
    "--e2b-port", "49999", "--health-bind", "0.0.0.0:8404",
    "--maps-dir", "/etc/cellgate-haproxy",
    "--configmap", "cellgate-haproxy", "--namespace", "cellgate",
]

# docs/containers.md's list: what building a jail takes, nothing more.
JAIL_CAPABILITIES = {"SYS_ADMIN", "SYS_CHROOT", "SETUID", "SETGID", "SETPCAP", "CHOWN", "FOWNER",
                     "DAC_OVERRIDE", "KILL"}
# A pod with hostUsers: false maps this many uids.
USERNS_UIDS = 65536


def load(name):
    with open(os.path.join(K8S, name), encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def all_objects():
    out = []
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        if os.path.basename(path) == "kustomization.yaml":
            continue  # kustomize's own file, not an API object
        for i, doc in enumerate(load(os.path.basename(path))):
            out.append({"file": os.path.relpath(path, ROOT), "index": i, "object": doc})
    return out


def one(name, kind):
    found = [d for d in load(name) if d["kind"] == kind]
    assert len(found) == 1, f"{name}: want one {kind}, found {len(found)}"
    return found[0]


def gateway_sets():
    return {"privileged": one("statefulset.yaml", "StatefulSet"),
            "least-privilege": one("cellgate-least-privilege.yaml", "StatefulSet")}


def container(sts):
    containers = sts["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["cellgate"]
    return containers[0]


def flag(args, name):
    """The value of --name=VALUE in a container's args (one of each)."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name}: {values}"
    return values[0]


def size(text):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "Ki": 1 << 10, "Mi": 1 << 20,
             "Gi": 1 << 30}
    m = re.fullmatch(r"(\d+)([KMG]i?)?", text)
    assert m, text
    return int(m.group(1)) * units[m.group(2) or ""]


# --- parsing and lint ---------------------------------------------------------------------------

def test_every_document_parses_and_the_kustomization_lists_the_default_profile():
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(K8S, "*.yaml")))
    assert len(files) >= 10
    for name in files:
        docs = load(name)
        assert docs, name
        for d in docs:
            assert isinstance(d, dict) and d.get("apiVersion") and d.get("kind"), name
    resources = one("kustomization.yaml", "Kustomization")["resources"]
    # Everything but the placeholder Secret, the other profile and the kustomization itself.
    left_out = {"secret.yaml", "cellgate-least-privilege.yaml", "kustomization.yaml"}
    assert sorted(resources) == sorted(set(files) - left_out)


def yamllint(path):
    if shutil.which("yamllint") is None:
        pytest.fail("no yamllint: install Debian's package (scripts/install-deps)")
    return subprocess.run(["yamllint", "-s", "-c", os.path.join(K8S, ".yamllint"), path],
                          capture_output=True, text=True, timeout=120)


def test_yamllint_passes():
    r = yamllint(K8S)
    assert r.returncode == 0, r.stdout + r.stderr


def test_yamllint_catches_a_bad_file(tmp_path):
    text = open(os.path.join(K8S, "pdb.yaml"), encoding="utf-8").read()
    bad = tmp_path / "pdb.yaml"
    bad.write_text(text.replace("maxUnavailable: 1", "maxUnavailable: 1   "))
    assert yamllint(str(bad)).returncode != 0


# --- kubernetes-models: the schemas, and the strict walk ---------------------------------------

def validate(objects):
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the kubernetes-models checks need Node.js "
                    "(scripts/install-deps installs it)")
    if not os.path.isdir(os.path.join(NODE_MODULES, "kubernetes-models")):
        pytest.fail(f"no kubernetes-models in {NODE_MODULES}: run `npm ci` in tests/js "
                    "(scripts/install-deps does)")
    r = subprocess.run(["node", VALIDATOR, NODE_MODULES], input=json.dumps(objects),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    reports = json.loads(r.stdout)
    assert len(reports) == len(objects)
    return reports


def test_every_object_validates_and_has_no_unknown_key():
    objects = all_objects()
    kinds = {o["object"]["kind"] for o in objects}
    assert {"Namespace", "ServiceAccount", "Secret", "Service", "StatefulSet", "Deployment",
            "ConfigMap", "PodDisruptionBudget", "PriorityClass", "RuntimeClass"} <= kinds
    bad = [r for r in validate(objects) if r["errors"] or r["unknown"]]
    assert not bad, json.dumps(bad, indent=2)


def test_the_walk_catches_what_validate_accepts():
    sts = one("cellgate-least-privilege.yaml", "StatefulSet")
    typo = copy.deepcopy(sts)
    sc = typo["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    sc["procMounts"] = sc.pop("procMount")  # a typo: the field silently does nothing
    typo["spec"]["template"]["spec"]["hostUser"] = False
    typo["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = "cellgate"
    wrong_type = copy.deepcopy(sts)
    container(wrong_type)["ports"][0]["containerPort"] = "eighty"
    typo_report, type_report = validate([
        {"file": "typo", "index": 0, "object": typo},
        {"file": "type", "index": 0, "object": wrong_type},
    ])
    assert typo_report["errors"] == []  # what validate() alone says
    assert sorted(typo_report["unknown"]) == [
        "/spec/template/spec/containers/0/securityContext/procMounts",
        "/spec/template/spec/hostUser",
    ]
    assert any("containerPort" in e for e in type_report["errors"]), type_report


# --- the gateways -------------------------------------------------------------------------------

@pytest.mark.parametrize("profile", ["privileged", "least-privilege"])
def test_gateway_statefulset(profile):
    sts = gateway_sets()[profile]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"] == {"type": "OnDelete"}

    # One gateway per node.
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()

    # The headless service names each pod, and only ready ones.
    svc = one("service.yaml", "Service")
    assert spec["serviceName"] == svc["metadata"]["name"] == "cellgate"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is False
    assert svc["spec"]["selector"].items() <= labels.items()

    # Identity, priority, disruption budget.
    assert pod["serviceAccountName"] == one("serviceaccount.yaml", "ServiceAccount")[
        "metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False
    pc = one("priorityclass.yaml", "PriorityClass")
    assert pod["priorityClassName"] == pc["metadata"]["name"]
    assert pc["value"] >= 1_000_000_000 and pc.get("globalDefault") is False
    pdb = one("pdb.yaml", "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["metadata"]["namespace"] == sts["metadata"]["namespace"]

    c = container(sts)
    env = {e["name"]: e for e in c["env"]}
    # The node tag is the pod ordinal, from the label the StatefulSet controller sets.
    assert env["CELLGATE_NODE_TAG"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}
    ns = sts["metadata"]["namespace"]
    assert env["CELLGATE_PEERS"]["value"] == f"cellgate.{ns}.svc.cluster.local:8888"
    secret = one("secret.yaml", "Secret")
    ref = env["CELLGATE_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]

    # Probes: GET /api (200 without a token) on the gateway's port.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    args = c["args"]
    assert ports["http"] == int(flag(args, "port")) == 8888
    assert ports["agent"] == int(flag(args, "agent-port"))
    assert ports["e2b"] == int(flag(args, "e2b-port"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/api", probe
        assert ports[c[probe]["httpGet"]["port"]] == 8888, probe

    # Guaranteed QoS, and room for every kernel's memory limit.
    res = c["resources"]
    assert res["requests"] == res["limits"] and {"cpu", "memory"} <= res["limits"].keys()
    kernels = int(flag(args, "max-kernels")) * size(flag(args, "memory").rstrip("B"))
    assert size(res["limits"]["memory"]) >= kernels + (1 << 30)

    # The state dir of the image's entrypoint.
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert "/var/lib/cellgate" in mounts
    assert pod["terminationGracePeriodSeconds"] >= 60


def test_privileged_profile():
    sts = gateway_sets()["privileged"]
    pod = sts["spec"]["template"]["spec"]
    assert container(sts)["securityContext"] == {"privileged": True}
    assert pod.get("hostUsers", True) is True
    ns = one("namespace.yaml", "Namespace")
    assert sts["metadata"]["namespace"] == ns["metadata"]["name"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # Long enough to hibernate kernels, should --hibernate-on-stop be switched on.
    assert pod["terminationGracePeriodSeconds"] >= 300
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    mounts = {m["mountPath"]: m["name"] for m in container(sts)["volumeMounts"]}
    assert mounts["/var/lib/cellgate"] in claims


def test_least_privilege_profile():
    docs = load("cellgate-least-privilege.yaml")
    sts = one("cellgate-least-privilege.yaml", "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    c = container(sts)
    sc = c["securityContext"]
    assert pod["hostUsers"] is False
    assert sc["privileged"] is False
    assert sc["procMount"] == "Unmasked"
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert len(sc["capabilities"]["add"]) == len(JAIL_CAPABILITIES)
    assert set(sc["capabilities"]["add"]) == JAIL_CAPABILITIES
    assert "NET_ADMIN" not in sc["capabilities"]["add"]
    assert sc["seccompProfile"] == {"type": "Localhost",
                                    "localhostProfile": "cellgate/cellgate.json"}
    assert os.path.isfile(os.path.join(K8S, "seccomp", "cellgate.json"))
    assert sc["appArmorProfile"] == {"type": "Unconfined"}
    assert "seccompProfile" not in pod.get("securityContext", {})  # no weaker pod-wide one

    # The RuntimeClass with a writable cgroupfs is there and used.
    [rc] = [d for d in docs if d["kind"] == "RuntimeClass"]
    assert pod["runtimeClassName"] == rc["metadata"]["name"] and rc["handler"]

    # Kernel uids inside the pod's 65536 mapped uids, above the image's own users.
    base = int(flag(c["args"], "kernel-uid-base"))
    span = int(flag(c["args"], "kernel-uid-range-size")) * int(flag(c["args"],
                                                                    "kernel-uid-ranges"))
    assert 1000 <= base and base + span <= USERNS_UIDS


# --- the seccomp profile ------------------------------------------------------------------------

def syscall_table():
    """x86_64 syscall names from the kernel headers (linux-libc-dev), or None."""
    path = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return set(re.findall(r"#define __NR_(\w+)", f.read()))


# Newer than Debian 12's headers (Linux 6.1): kept so that a newer glibc's first try gets
# allowed, not EPERM where it expects ENOSYS to fall back.
NEWER_SYSCALLS = {"cachestat", "fchmodat2", "futex_requeue", "futex_wait", "futex_wake",
                  "map_shadow_stack"}


def test_seccomp_profile():
    with open(os.path.join(K8S, "seccomp", "cellgate.json"), encoding="utf-8") as f:
        profile = json.load(f)
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert profile["architectures"] == ["SCMP_ARCH_X86_64"]
    actions = {"SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO"}
    allowed = set()
    for rule in profile["syscalls"]:
        assert rule["action"] in actions and rule["names"], rule
        assert set(rule) <= {"names", "action", "args", "errnoRet", "comment"}, rule
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args"):
            allowed |= set(rule["names"])
    assert {"pivot_root", "mount", "umount2", "unshare", "setns", "clone", "clone3",
            "mount_setattr", "sethostname", "seccomp", "landlock_create_ruleset",
            "landlock_add_rule", "landlock_restrict_self", "execveat", "pidfd_open",
            "pidfd_send_signal", "openat2", "close_range"} <= allowed
    # Off: keyrings; and what RuntimeDefault also denies a container.
    for name in ("keyctl", "add_key", "request_key", "bpf", "ptrace", "kexec_load",
                 "init_module", "open_by_handle_at", "reboot", "userfaultfd"):
        assert name not in allowed, name
    keyring = [r for r in profile["syscalls"] if "keyctl" in r["names"]]
    assert keyring and keyring[0]["action"] == "SCMP_ACT_ERRNO"
    table = syscall_table()
    if table is not None:  # a typo would silently allow nothing
        names = {n for r in profile["syscalls"] for n in r["names"]}
        assert names - table <= NEWER_SYSCALLS, sorted(names - table - NEWER_SYSCALLS)


# --- the router ---------------------------------------------------------------------------------

def test_haproxy_configmap_is_what_the_generator_writes():
    r = subprocess.run(["/usr/bin/python3", GENERATOR, *CONFIGMAP_ARGS], capture_output=True,
                       text=True, timeout=60, check=True)
    with open(os.path.join(K8S, "haproxy-configmap.yaml"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == r.stdout, (
        "deploy/kubernetes/haproxy-configmap.yaml is stale; write it again with\n  "
        + shlex.join(["deploy/haproxy/cellgate-haproxy", *CONFIGMAP_ARGS])
        + " > deploy/kubernetes/haproxy-configmap.yaml")


def test_haproxy_configmap_passes_haproxy_check(tmp_path):
    """The committed config, with its two absolute paths moved to a temp dir."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.access(haproxy, os.X_OK):
        pytest.fail("no haproxy: install Debian's package (scripts/install-deps)")
    data = one("haproxy-configmap.yaml", "ConfigMap")["data"]
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    cfg = data["haproxy.cfg"].replace("/etc/cellgate-haproxy", str(tmp_path))
    cfg = cfg.replace("/run/haproxy/admin.sock", str(tmp_path / "admin.sock"))
    (tmp_path / "haproxy.cfg").write_text(cfg)
    r = subprocess.run([haproxy, "-c", "-f", str(tmp_path / "haproxy.cfg")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_haproxy_deployment_matches_its_config():
    cm = one("haproxy-configmap.yaml", "ConfigMap")
    cfg = cm["data"]["haproxy.cfg"]
    dep = one("haproxy-deployment.yaml", "Deployment")
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert dep["spec"]["replicas"] >= 2
    # The ConfigMap is mounted where the config reads its maps, and run from there.
    volume = [v for v in pod["volumes"] if v.get("configMap")]
    assert [v["configMap"]["name"] for v in volume] == [cm["metadata"]["name"]]
    mount = [m for m in c["volumeMounts"] if m["name"] == volume[0]["name"]][0]
    assert f"default-path origin {mount['mountPath']}\n" in cfg
    assert c["args"] == ["-f", f"{mount['mountPath']}/haproxy.cfg"]
    assert {"tags.map", "override.map", "unknown-node.http"} <= cm["data"].keys()
    # The Runtime API socket's directory is writable under a read-only root.
    sock = re.search(r"stats socket (\S+) .*level admin", cfg).group(1)
    assert os.path.dirname(sock) in {m["mountPath"] for m in c["volumeMounts"]}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # Every gateway the StatefulSets may run has a backend: --nodes >= replicas.
    nodes = len(re.findall(r"^backend be_n\d+$", cfg, re.M))
    assert nodes == 16
    assert all(s["spec"]["replicas"] <= nodes for s in gateway_sets().values())
    for n in (0, 15):
        assert f"server n{n} cellgate-{n}.cellgate.cellgate.svc.cluster.local:8888" in cfg
    # The Service reaches both frontends; probes hit the health frontend.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"bind 0.0.0.0:{ports['http']}\n" in cfg and f"bind 0.0.0.0:{ports['e2b']}\n" in cfg
    assert f"bind 0.0.0.0:{ports['health']}\n" in cfg and "monitor-uri /healthz" in cfg
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    svc = one("haproxy-service.yaml", "Service")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"][
        "labels"].items()
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"http", "e2b"}
    # The agent port the router asks is the one the gateways serve.
    agent = re.search(r"agent-check agent-port (\d+)", cfg).group(1)
    for sts in gateway_sets().values():
        assert flag(container(sts)["args"], "agent-port") == agent
