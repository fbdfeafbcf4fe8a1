#!/usr/bin/env python3
"""Validates deploy/kubernetes against the Kubernetes API schemas, offline.

Every object of every kustomization here (the base and the single-tenant/ overlay, with its patches
merged in the way kustomize merges these ones) is checked with `kubernetes-validate` (PyPI; the
schemas ship inside the package) in strict mode (unknown fields are errors), for the oldest and
the newest Kubernetes versions we claim. Then what the schemas cannot know: the kustomizations'
files exist, patches name objects of the base, the Secret keys and ConfigMap the Deployment uses
exist, probes ask /healthz and /readyz, and terminationGracePeriodSeconds covers the preStop sleep
plus the gateway's drain_grace_secs and shutdown_grace_secs. Last, the validator must reject broken manifests (a
validator that accepts anything proves nothing).

    pip install kubernetes-validate==1.37.0 && python3 deploy/kubernetes/validate.py
"""

from __future__ import annotations

import copy
import os
import sys

import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
VERSIONS = ["1.33", "1.37"]

errors: list[str] = []


def fail(msg: str) -> None:
    errors.append(msg)
    print(f"FAIL {msg}")


def load_docs(path: str) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def merge(base, patch):
    """Strategic-merge the way kustomize does for what our patches use: maps merge, lists of
    named maps (containers, volumes, env) merge by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(x, dict) and "name" in x for x in base + patch)
    ):
        out = [copy.deepcopy(x) for x in base]
        for p in patch:
            for i, b in enumerate(out):
                if b["name"] == p["name"]:
                    out[i] = merge(b, p)
                    break
            else:
                out.append(copy.deepcopy(p))
        return out
    return copy.deepcopy(patch)


def build(directory: str) -> list[dict]:
    """The objects a kustomization directory renders (resources, then patches)."""
    kpath = os.path.join(directory, "kustomization.yaml")
    kust = load_docs(kpath)[0]
    if kust.get("kind") != "Kustomization":
        fail(f"{kpath}: not a Kustomization")
    objects: list[dict] = []
    for res in kust.get("resources", []):
        path = os.path.normpath(os.path.join(directory, res))
        if os.path.isdir(path):
            objects += build(path)
        elif os.path.isfile(path):
            objects += load_docs(path)
        else:
            fail(f"{kpath}: resource {res} does not exist")
    for patch in kust.get("patches", []):
        path = os.path.join(directory, patch["path"])
        for p in load_docs(path):
            for i, obj in enumerate(objects):
                if key(obj) == key(p) and obj["apiVersion"] == p["apiVersion"]:
                    objects[i] = merge(obj, p)
                    break
            else:
                fail(f"{path}: patches {key(p)}, which the base does not have")
    seen = set()
    for obj in objects:
        if key(obj) in seen:
            fail(f"{directory}: {key(obj)} defined twice")
        seen.add(key(obj))
    if "namespace" in kust:
        for obj in objects:
            if obj["kind"] != "Namespace":
                obj["metadata"]["namespace"] = kust["namespace"]
    return objects


def schema_errors(obj: dict, version: str) -> str | None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
        return None
    except kubernetes_validate.ValidationError as e:
        where = "/".join(str(p) for p in e.path)
        return f"{where}: {e.message}"
    except kubernetes_validate.SchemaNotFoundError as e:
        return e.message


def check_consistency(name: str, objects: list[dict]) -> None:
    by_key = {key(o): o for o in objects}
    dep = by_key.get(("Deployment", "acp-gateway"))
    if dep is None:
        fail(f"{name}: no Deployment acp-gateway")
        return
    pod = dep["spec"]["template"]["spec"]
    gw = next(c for c in pod["containers"] if c["name"] == "gateway")
    for env in gw.get("env", []):
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            secret = by_key.get(("Secret", ref["name"]))
            data = {**(secret or {}).get("stringData", {}), **(secret or {}).get("data", {})}
            if ref["key"] not in data:
                fail(f"{name}: env {env['name']} wants Secret {ref['name']} key {ref['key']}, which is missing")
    probes = {p: gw.get(p, {}).get("httpGet", {}).get("path") for p in ("livenessProbe", "readinessProbe")}
    if probes != {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}:
        fail(f"{name}: probes should be /healthz (liveness) and /readyz (readiness), are {probes}")
    ports = {p["name"] for p in gw.get("ports", [])}
    for obj in objects:
        if obj["kind"] == "Service" and obj["metadata"]["name"] == "acp-gateway":
            for p in obj["spec"]["ports"]:
                if isinstance(p.get("targetPort"), str) and p["targetPort"] not in ports:
                    fail(f"{name}: Service targets port {p['targetPort']}, the container has {ports}")
    for vol in pod.get("volumes", []):
        cm = vol.get("configMap", {}).get("name")
        if cm and ("ConfigMap", cm) not in by_key:
            fail(f"{name}: volume {vol['name']} wants ConfigMap {cm}, which is missing")
    if gw["securityContext"].get("readOnlyRootFilesystem"):
        mounts = {m["mountPath"] for m in gw.get("volumeMounts", [])}
        for path in ("/var/lib/acp-gateway/data", "/tmp"):
            if path not in mounts:
                fail(f"{name}: read-only root filesystem but nothing writable mounted at {path}")
    config = by_key.get(("ConfigMap", "acp-gateway"), {}).get("data", {}).get("gateway.toml")
    try:
        import tomllib
    except ImportError:  # Python < 3.11: skip the file's own checks
        tomllib = None
    if config is not None and tomllib is not None:
        toml = tomllib.loads(config)
        grace = toml.get("limits", {}).get("shutdown_grace_secs", 10)
        drain = toml.get("limits", {}).get("drain_grace_secs", 10)
        pre = gw.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        pre_secs = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
        total = pod.get("terminationGracePeriodSeconds", 30)
        if total < pre_secs + drain + grace + 5:
            fail(
                f"{name}: terminationGracePeriodSeconds {total} < preStop {pre_secs} + "
                f"drain_grace_secs {drain} + shutdown_grace_secs {grace} + 5 s margin"
            )
        print(
            f"ok   {name}: grace {total} s >= preStop {pre_secs} s + drain_grace_secs {drain} s"
            f" + shutdown_grace_secs {grace} s + margin"
        )


def check_rejects_broken(objects: list[dict]) -> None:
    dep = next(o for o in objects if o["kind"] == "Deployment")
    broken = []
    b = copy.deepcopy(dep)
    b["spec"]["replicas"] = "two"
    broken.append(("replicas as a string", b))
    b = copy.deepcopy(dep)
    b["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["pth"] = "/healthz"
    broken.append(("an unknown field (pth)", b))
    b = copy.deepcopy(dep)
    del b["spec"]["template"]["spec"]["containers"][0]["name"]
    broken.append(("a container without a name", b))
    b = copy.deepcopy(dep)
    b["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = "yes"
    broken.append(("runAsNonRoot as a string", b))
    for what, obj in broken:
        for version in VERSIONS:
            if schema_errors(obj, version) is None:
                fail(f"the validator accepted a Deployment with {what} (Kubernetes {version})")
            else:
                print(f"ok   rejected: a Deployment with {what} (Kubernetes {version})")


def main() -> int:
    print(f"kubernetes-validate {kubernetes_validate.__version__ if hasattr(kubernetes_validate, '__version__') else ''}".strip())
    for name in ("", "single-tenant"):
        directory = os.path.join(HERE, name)
        label = f"deploy/kubernetes/{name}".rstrip("/")
        objects = build(directory)
        for obj in objects:
            for version in VERSIONS:
                err = schema_errors(obj, version)
                if err:
                    fail(f"{label}: {obj['kind']}/{obj['metadata']['name']} (Kubernetes {version}): {err}")
            print(f"ok   {label}: {obj['kind']}/{obj['metadata']['name']} (Kubernetes {', '.join(VERSIONS)})")
        check_consistency(label, objects)
        if name == "":
            check_rejects_broken(objects)
    if errors:
        print(f"{len(errors)} manifest problems", file=sys.stderr)
        return 1
    print("manifests valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
