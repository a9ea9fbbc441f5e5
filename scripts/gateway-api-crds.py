#!/usr/bin/env python3
"""Writes examples/kubernetes/gateway-api/crds/*.yaml: the Gateway API standard-channel CRDs weir
reads, adapted so that the test API server (kube-apiserver 1.20, scripts/kube-apiserver.sh)
accepts them.

    scripts/gateway-api-crds.py GATEWAY_API_GIT_DIR [TAG]     (TAG defaults to v1.6.1)

Adaptations, nothing else changes:
- every `x-kubernetes-validations` (CEL rules) is dropped: CEL validation arrived in
  Kubernetes 1.25, and 1.20 refuses the field. The same rules are checked by weir's translation
  (an object they would reject gets a condition and a warning), so a cluster with the upstream
  CRDs and one with these behave the same for valid objects;
- versions the upstream marks `served: false` (TLSRoute v1alpha2, v1alpha3) are left out;
- `default: ""` (the core group of certificate and backend references) is dropped: 1.20 stores
  it as null and refuses the CRD. An unset group means the core group anyway;
- the `group` of `caCertificateRefs` items (`ObjectReference`, core group `""`) is not
  required: 1.20 stores `group: ""` as null and refuses the object, so on the test API server a
  reference to a ConfigMap leaves the group out (weir reads an unset group as the core group);
- experimental-channel fields weir serves are taken from the experimental CRD of the same tag
  into the standard one (EXPERIMENTAL below: HTTPRoute `rules[].retry`), so that objects using
  them can be stored.

On a real cluster install the upstream CRDs instead (kubectl apply -f the release's
standard-install.yaml); weir reads the same objects.
"""

import subprocess
import sys
from pathlib import Path

import yaml

KINDS = ["gatewayclasses", "gateways", "httproutes", "grpcroutes", "tlsroutes", "referencegrants", "listenersets"]

# Experimental-channel fields weir serves: kind -> property paths under each version's
# openAPIV3Schema, copied from the experimental CRD.
EXPERIMENTAL = {"httproutes": [("spec", "rules", "retry")]}


def schema_at(version, path):
    """The `properties` map holding the last element of `path` (arrays stepped through)."""
    node = version["schema"]["openAPIV3Schema"]
    for name in path[:-1]:
        node = node["properties"][name]
        if node.get("type") == "array":
            node = node["items"]
    return node["properties"]


def graft(crd, experimental, paths):
    """Copies each of `paths` from the experimental CRD's versions into `crd`'s of the same name."""
    by_name = {v["name"]: v for v in experimental["spec"]["versions"]}
    for version in crd["spec"]["versions"]:
        source = by_name.get(version["name"])
        for path in paths:
            if source is not None:
                schema_at(version, path)[path[-1]] = schema_at(source, path)[path[-1]]


def strip(node):
    if isinstance(node, dict):
        node.pop("x-kubernetes-validations", None)
        if node.get("default") == "":
            node.pop("default")
        refs = node.get("properties", {}).get("caCertificateRefs", {}).get("items", {})
        if "group" in refs.get("required", []):
            refs["required"].remove("group")
        for value in node.values():
            strip(value)
    elif isinstance(node, list):
        for value in node:
            strip(value)


def literal(dumper, text):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


def main():
    git_dir = sys.argv[1]
    tag = sys.argv[2] if len(sys.argv) > 2 else "v1.6.1"
    out = Path(__file__).resolve().parent.parent / "examples/kubernetes/gateway-api/crds"
    out.mkdir(parents=True, exist_ok=True)
    yaml.add_representer(str, literal)
    for kind in KINDS:
        path = f"config/crd/standard/gateway.networking.k8s.io_{kind}.yaml"
        text = subprocess.run(
            ["git", "-C", git_dir, "show", f"{tag}:{path}"], check=True, capture_output=True, text=True
        ).stdout
        crd = yaml.safe_load(text)
        if kind in EXPERIMENTAL:
            exp_path = f"config/crd/experimental/gateway.networking.k8s.io_{kind}.yaml"
            exp_text = subprocess.run(
                ["git", "-C", git_dir, "show", f"{tag}:{exp_path}"], check=True, capture_output=True, text=True
            ).stdout
            graft(crd, yaml.safe_load(exp_text), EXPERIMENTAL[kind])
        crd["spec"]["versions"] = [v for v in crd["spec"]["versions"] if v.get("served")]
        strip(crd)
        header = (
            f"# Gateway API {tag} standard channel, {path}, adapted for kube-apiserver 1.20 by\n"
            "# scripts/gateway-api-crds.py: x-kubernetes-validations (CEL, Kubernetes 1.25+) and empty\n"
            "# string defaults dropped, caCertificateRefs' group optional, versions not served left\n"
            "# out. Do not edit: regenerate.\n"
            + "".join(f"# Added from the experimental channel: {'.'.join(p)}.\n" for p in EXPERIMENTAL.get(kind, []))
        )
        body = yaml.dump(crd, sort_keys=False, width=100000, allow_unicode=True)
        (out / f"{kind}.yaml").write_text(header + body)


if __name__ == "__main__":
    main()
