#!/usr/bin/env python3
"""Checks deploy/kubernetes/ offline: every document parses, its kind is one of the
current API versions, the CSI driver's name is the one the plugin reports, each
sidecar reaches the plugin's socket on a shared volume, the node registrar tells the
kubelet the socket's host path, images are pinned, service accounts exist, and the
StorageClasses pass only parameters the plugin takes.

Usage: harness/check-manifests.py [DIR]   (default deploy/kubernetes)
"""

import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = "csi.weft.io"
CURRENT = {
    ("v1", "Namespace"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "DaemonSet"),
    ("storage.k8s.io/v1", "CSIDriver"),
    ("storage.k8s.io/v1", "StorageClass"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("snapshot.storage.k8s.io/v1", "VolumeSnapshotClass"),
}
PARAMETERS = {
    "pool", "replicas", "ec", "thick", "blockSize", "fsType",
    "iopsMax", "bwMax", "readIopsMax", "readBwMax", "writeIopsMax", "writeBwMax",
}
SIDECARS = ("csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter",
            "livenessprobe", "csi-node-driver-registrar")

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


def flag(args, name):
    for arg in args:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def mount_of(container, path_dir):
    """The volume a container mounts at `path_dir`, if any."""
    for mount in container.get("volumeMounts", []):
        if mount["mountPath"].rstrip("/") == path_dir.rstrip("/"):
            return mount["name"]
    return None


def check_workload(where, doc, accounts):
    spec = doc["spec"]["template"]["spec"]
    if spec.get("serviceAccountName") not in accounts:
        problem(where, f"service account {spec.get('serviceAccountName')} is not defined")
    containers = spec["containers"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    plugin = next((c for c in containers if c.get("args", [None])[0] == "csi"), None)
    if plugin is None:
        return problem(where, "no container runs `weft csi`")
    endpoint = flag(plugin["args"], "endpoint") or ""
    if not endpoint.startswith("unix:///"):
        return problem(where, f"endpoint {endpoint!r} is not unix:///...")
    socket = endpoint[len("unix://"):]
    socket_dir, socket_name = os.path.split(socket)
    volume = mount_of(plugin, socket_dir)
    if volume is None:
        return problem(where, f"the plugin's socket directory {socket_dir} is not a mounted volume")
    mode = flag(plugin["args"], "mode")
    wanted = "controller" if doc["kind"] == "Deployment" else "node"
    if mode != wanted:
        problem(where, f"--mode={mode}, expected {wanted}")
    for container in containers:
        image = container.get("image", "")
        if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest"):
            problem(where, f"image {image} is not pinned to a version")
        if container is plugin:
            continue
        if not any(s in image for s in SIDECARS):
            problem(where, f"container {container['name']}: unknown image {image}")
        address = flag(container.get("args", []), "csi-address")
        if address != socket:
            problem(where, f"{container['name']}: --csi-address={address}, the plugin listens on {socket}")
        if mount_of(container, socket_dir) != volume:
            problem(where, f"{container['name']}: does not mount volume {volume} at {socket_dir}")
        registration = flag(container.get("args", []), "kubelet-registration-path")
        if registration is not None:
            host = volumes.get(volume, {}).get("hostPath", {}).get("path")
            if registration != f"{host}/{socket_name}":
                problem(where, f"registrar: --kubelet-registration-path={registration}, the socket is {host}/{socket_name} on the host")
    if doc["kind"] == "DaemonSet":
        kubelet = next((m for m in plugin.get("volumeMounts", []) if m["mountPath"] == "/var/lib/kubelet"), None)
        if kubelet is None or kubelet.get("mountPropagation") != "Bidirectional":
            problem(where, "the node plugin must mount /var/lib/kubelet with Bidirectional propagation")
        if not plugin.get("securityContext", {}).get("privileged"):
            problem(where, "the node plugin must be privileged (it connects NVMe and mounts)")


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "deploy", "kubernetes")
    docs = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(directory, name)) as f:
            try:
                found = [d for d in yaml.safe_load_all(f) if d]
            except yaml.YAMLError as error:
                problem(name, f"does not parse: {error}")
                continue
        docs += [(f"{name}: {d.get('kind')} {d.get('metadata', {}).get('name')}", d) for d in found]
    accounts = {d["metadata"]["name"] for _, d in docs if d.get("kind") == "ServiceAccount"}
    kinds = set()
    for where, doc in docs:
        kind = (doc.get("apiVersion"), doc.get("kind"))
        kinds.add(kind[1])
        if kind not in CURRENT:
            problem(where, f"{kind[0]} {kind[1]} is not a current API version this check knows")
        if kind[1] == "CSIDriver" and doc["metadata"]["name"] != DRIVER:
            problem(where, f"the driver is {DRIVER}")
        if kind[1] == "VolumeSnapshotClass" and doc.get("driver") != DRIVER:
            problem(where, f"driver {doc.get('driver')}, not {DRIVER}")
        if kind[1] == "StorageClass":
            if doc.get("provisioner") != DRIVER:
                problem(where, f"provisioner {doc.get('provisioner')}, not {DRIVER}")
            for key in doc.get("parameters", {}):
                if key not in PARAMETERS and not key.startswith("csi.storage.k8s.io/"):
                    problem(where, f"parameter {key} is not one the plugin takes")
        if kind[1] == "ClusterRoleBinding":
            for subject in doc.get("subjects", []):
                if subject["kind"] == "ServiceAccount" and subject["name"] not in accounts:
                    problem(where, f"binds undefined service account {subject['name']}")
        if kind[1] in ("Deployment", "DaemonSet"):
            check_workload(where, doc, accounts)
    for needed in ("CSIDriver", "StorageClass", "VolumeSnapshotClass", "Deployment", "DaemonSet", "ClusterRole"):
        if needed not in kinds:
            problem(directory, f"no {needed}")
    for line in problems:
        print(f"check-manifests: {line}")
    if problems:
        sys.exit(1)
    print(f"check-manifests: {len(docs)} documents in {directory}: ok")


if __name__ == "__main__":
    main()
