#!/usr/bin/python3
"""deploy/k8s/*.yaml: every manifest parses, and every pdserve command line in them is accepted by
`pdserve ... --dry-run` (the flags and the files they name). The container's paths are mapped onto
this checkout: /models/demo-llama -> models/demo-llama, the mounted cluster secret -> a temporary
file, $(POD_IP) -> 127.0.0.1. A deliberately broken copy of each command line must be refused,
naming the flag.

usage: manifests_test.py PDSERVE_BINARY REPO_ROOT   (exit 77: python3-yaml is absent)
"""
import glob
import os
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed (scripts/install-deps.sh installs it)")
    sys.exit(77)


def containers(doc):
    """Every container spec in a Deployment / StatefulSet / Pod document."""
    if not isinstance(doc, dict):
        return []
    spec = doc.get("spec", {}) or {}
    pod = spec.get("template", {}).get("spec", {}) if "template" in spec else spec
    return (pod or {}).get("containers", []) or []


def pdserve_argv(container):
    """The argv after the binary when the container runs pdserve, else None."""
    command = container.get("command") or []
    args = container.get("args") or []
    image = container.get("image", "")
    if command and not command[0].endswith("pdserve"):
        return None
    if not command and not image.startswith("pdserve"):
        return None
    return [str(a) for a in command[1:] + args]


def localize(argv, repo, secret_file):
    out = []
    for a in argv:
        a = a.replace("$(POD_IP)", "127.0.0.1")
        a = a.replace("/models/demo-llama", os.path.join(repo, "models", "demo-llama"))
        a = a.replace("/etc/pdserve/secret/cluster-secret", secret_file)
        out.append(a)
    return out


def run(binary, argv):
    p = subprocess.run([binary] + argv + ["--dry-run"], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout + p.stderr


def main():
    binary, repo = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(repo, "deploy", "k8s", "*.yaml")))
    assert files, "no manifests under deploy/k8s"
    failures = []
    checked = 0
    roles = set()
    with tempfile.TemporaryDirectory() as tmp:
        secret_file = os.path.join(tmp, "cluster-secret")
        with open(secret_file, "w") as f:
            f.write("0123456789abcdef\n")
        for path in files:
            with open(path) as f:
                docs = list(yaml.safe_load_all(f))  # raises on a manifest that does not parse
            for doc in docs:
                assert doc is None or ("kind" in doc and "apiVersion" in doc), \
                    f"{path}: a document without kind/apiVersion"
                for c in containers(doc):
                    argv = pdserve_argv(c)
                    if argv is None:
                        continue
                    argv = localize(argv, repo, secret_file)
                    roles.add(next((a.split("=", 1)[1] for a in argv if a.startswith("--role=")),
                                   argv[0]))
                    rc, out = run(binary, argv)
                    checked += 1
                    if rc != 0:
                        failures.append(f"{path} {c.get('name')}: exit {rc}: {out.strip()}")
                    # A broken copy is refused, naming the flag.
                    rc, out = run(binary, argv + ["--discovery-ttl-s=1"])
                    if rc == 0 or "--discovery-ttl-s" not in out:
                        failures.append(f"{path} {c.get('name')}: a TTL of 1 s was not refused "
                                        f"naming --discovery-ttl-s (exit {rc}): {out.strip()}")
    print(f"checked {checked} pdserve command lines in {len(files)} manifests: {sorted(roles)}")
    for f in failures:
        print("FAIL:", f)
    assert {"prefill", "decode", "router"} <= roles, f"missing roles: {roles}"
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
