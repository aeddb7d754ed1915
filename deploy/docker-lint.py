#!/usr/bin/env python3
"""Structural checks of deploy/Dockerfile, for machines without a Docker engine (`make docker-lint`).

Checks that the image is built the way the project expects: a named Rust build stage that runs
`cargo build --release --locked --bin twc`, pinned base images, a runtime stage that copies only
the binary from the build stage and runs it as a numeric non-root user in exec form, a Rust
version no older than the workspace's rust-version, and a .dockerignore that keeps build
outputs and tools out of the context. Exits non-zero with one line per problem.

`make docker-lint` then checks that Cargo.lock is up to date for `--locked` (`cargo metadata
--locked`) and type-checks `twc` with its own dependency graph's features (`cargo check --locked
--bin twc`; see the Makefile).
"""

import json
import re
import sys
from pathlib import Path

BUILD_COMMAND = "cargo build --release --locked --bin twc"
IGNORED_DIRS = ("target", ".tools", ".git")


def instructions(text):
    """(line number, INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    result, pending, start = [], "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append((start, keyword.upper(), " ".join(args.split())))
    return result


def substitute(value, args):
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), value)


def version_tuple(text):
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def lint(dockerfile, root):
    problems = []
    parsed = instructions(dockerfile.read_text())
    args, stages = {}, []
    for number, keyword, rest in parsed:
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            parts = rest.split()
            image = substitute(parts[0], args)
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append({"line": number, "image": image, "name": name, "body": []})
        elif stages:
            stages[-1]["body"].append((number, keyword, rest))
        else:
            problems.append(f"line {number}: {keyword} before the first FROM")

    if len(stages) < 2:
        return problems + ["expected a build stage and a runtime stage (multi-stage build)"]
    for stage in stages:
        image = stage["image"]
        tag = image.rsplit("/", 1)[-1]
        if "$" in image:
            problems.append(f"line {stage['line']}: unresolved variable in base image {image}")
        if "@sha256:" not in image and (":" not in tag or tag.endswith(":latest")):
            problems.append(f"line {stage['line']}: base image {image} is not pinned to a tag")

    build, runtime = stages[0], stages[-1]
    if not build["name"]:
        problems.append(f"line {build['line']}: the build stage needs a name (FROM ... AS build)")
    if not build["image"].split("/")[-1].startswith("rust:"):
        problems.append(f"line {build['line']}: the build stage should use the official rust image")
    runs = [rest for _, keyword, rest in build["body"] if keyword == "RUN"]
    if not any(BUILD_COMMAND in run for run in runs):
        problems.append(f"the build stage does not run `{BUILD_COMMAND}`")
    workspace = (root / "Cargo.toml").read_text()
    wanted = re.search(r'rust-version\s*=\s*"([^"]+)"', workspace)
    rust = args.get("RUST_VERSION", "")
    if wanted and (not rust or version_tuple(rust) < version_tuple(wanted.group(1))):
        problems.append(f"ARG RUST_VERSION={rust} is older than the workspace rust-version {wanted.group(1)}")
    for number, keyword, rest in build["body"]:
        if keyword in ("COPY", "ADD"):
            sources = [s for s in rest.split() if not s.startswith("--")][:-1]
            for source in sources:
                if not (root / source).exists():
                    problems.append(f"line {number}: {keyword} source {source} does not exist")
        if keyword == "ADD" and re.search(r"https?://", rest):
            problems.append(f"line {number}: ADD of a URL; download in a RUN with a checksum")

    body = runtime["body"]
    copies = [rest for _, keyword, rest in body if keyword == "COPY"]
    if not any(f"--from={build['name']}" in c for c in copies):
        problems.append("the runtime stage does not copy the binary from the build stage")
    if any(keyword == "RUN" for _, keyword, _ in body):
        problems.append("the runtime stage runs commands; it should only copy the binary")
    users = [rest for _, keyword, rest in body if keyword == "USER"]
    if not users:
        problems.append("the runtime stage sets no USER (it would run as root)")
    else:
        user = users[-1].split(":")[0]
        if not user.isdigit() or user == "0":
            problems.append(f"USER {users[-1]}: use a numeric non-root UID so runAsNonRoot can verify it")
    entrypoints = [rest for _, keyword, rest in body if keyword == "ENTRYPOINT"]
    try:
        entrypoint = json.loads(entrypoints[-1]) if entrypoints else None
    except json.JSONDecodeError:
        entrypoint = None
    if not (isinstance(entrypoint, list) and entrypoint and entrypoint[0].endswith("/twc")):
        problems.append("ENTRYPOINT must be the twc binary in exec (JSON) form")

    ignore = root / ".dockerignore"
    patterns = ignore.read_text().split() if ignore.exists() else []
    for directory in IGNORED_DIRS:
        if directory not in patterns and f"/{directory}" not in patterns:
            problems.append(f".dockerignore does not exclude {directory}")
    return problems


def main():
    dockerfile = Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/Dockerfile")
    root = Path(sys.argv[2] if len(sys.argv) > 2 else ".")
    problems = lint(dockerfile, root)
    for problem in problems:
        print(f"{dockerfile}: {problem}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"{dockerfile}: ok")


if __name__ == "__main__":
    main()
