"""The Kubernetes manifests of ``deploy/kubernetes``: valid against the
Kubernetes API's schemas (strict: no unknown fields), and consistent with how
controllers find workers (a headless Service named as the StatefulSet, the
port discovery defaults to, the token mounted read-only, readiness from the
worker's health RPC through ``colocated status``)."""

import os

import kubernetes_validate
import pytest
import yaml

from colocated import _colocated

DEPLOY = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "kubernetes")
#: The oldest Kubernetes release the manifests must suit, and the newest known.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())


def documents(name):
    with open(os.path.join(DEPLOY, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def by_kind(docs, kind):
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


@pytest.mark.parametrize("name", ["workers.yaml", "controller.yaml"])
@pytest.mark.parametrize("version", VERSIONS)
def test_the_manifests_are_valid_kubernetes_objects(name, version):
    for doc in documents(name):
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_broken_manifest_is_caught():
    # The check itself can fail: an unknown field and a wrong type.
    service = by_kind(documents("workers.yaml"), "Service")
    service["spec"]["clusterIp"] = "None"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, VERSIONS[-1], strict=True)
    statefulset = by_kind(documents("workers.yaml"), "StatefulSet")
    statefulset["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, VERSIONS[-1], strict=True)


def test_workers_are_found_where_controllers_look():
    docs = documents("workers.yaml")
    service, statefulset = by_kind(docs, "Service"), by_kind(docs, "StatefulSet")
    # Pod i of the StatefulSet is NAME-i.SERVICE.NAMESPACE.svc: discovery's
    # default is a StatefulSet named as its Service.
    assert service["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"] == statefulset["metadata"]["name"]
    selector = statefulset["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector == statefulset["spec"]["template"]["metadata"]["labels"]
    pod = statefulset["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    # The port controllers dial by default.
    assert any(a == "--listen=0.0.0.0:61440" for a in worker["args"])
    assert worker["ports"][0]["containerPort"] == 61440 == service["spec"]["ports"][0]["port"]
    # Every flag is one the worker takes.
    flags = {f"--{name}" for name, *_ in _colocated.worker_flags()}
    for arg in worker["args"][1:]:
        assert arg.split("=")[0] in flags, arg
    # The token: a Secret, mounted read-only, readable by the owner only.
    (mount,) = [m for m in worker["volumeMounts"] if m["name"] == "token"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == "token"]
    assert volume["secret"]["defaultMode"] == 0o400
    token_file = f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
    assert f"--token-file={token_file}" in worker["args"]
    # Ready once the worker answers its health RPC (with the token).
    probe = worker["readinessProbe"]["exec"]["command"]
    assert probe[:3] == ["colocated", "status", "127.0.0.1:61440"]
    assert f"--token-file={token_file}" in probe
    status_flags = {f"--{name}" for name, *_ in _colocated.status_flags()}
    for arg in probe[3:]:
        assert arg.split("=")[0] in status_flags, arg
    assert pod["automountServiceAccountToken"] is False


def test_the_controller_names_the_service_and_replicas_discovery_reads():
    workers = documents("workers.yaml")
    job = by_kind(documents("controller.yaml"), "Job")
    (controller,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in controller["env"]}
    assert env["COLOCATED_KUBERNETES_SERVICE"] == by_kind(workers, "Service")["metadata"]["name"]
    assert int(env["COLOCATED_KUBERNETES_REPLICAS"]) == by_kind(workers, "StatefulSet")["spec"]["replicas"]
    assert "/var/run/colocated/token" in controller["command"][-1]
