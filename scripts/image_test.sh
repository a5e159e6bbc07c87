#!/usr/bin/env bash
# `make image-test`: builds each stack's CPU image (docker/Dockerfile.cpu) on a base made here from
# Debian's archive, no registry needed, and runs the main job (`make main`) inside each, checking
# its exact test accuracy line and pictures. Needs root, podman, buildah and mmdebstrap (installed
# with apt-get when missing). Not part of `make test`; docs/stacks.md ("Container images") has its
# figures and what it does not verify.
#   IMAGE_TEST_STACKS   stacks to build and run (default: mission current)
#   IMAGE_TEST_CACHE    bases (mmdebstrap tars) and the jobs' download cache (default: /var/cache/pipelines-image-test)
#   IMAGE_TEST_OUT      the main job's outputs, one folder per stack, owned by the caller (default: out-image)
#   IMAGE_TEST_RUN=0    build the images only
#   IMAGE_TEST_CA       CA bundle pip trusts in the builds and runs (default: this machine's
#                       /etc/ssl/certs/ca-certificates.crt; empty: the image's own), mounted, never copied in
# A second run reuses the bases, podman's layers and pip's cache (a build-time mount) and the
# downloaded sample photos and weights.
set -euo pipefail
shopt -s inherit_errexit  # a failure inside $(...) (the base's making) stops the script too
# Only builtins until the tools are known to be there (a refusal works with any PATH).
here=${BASH_SOURCE[0]%/*}; [ "$here" != "${BASH_SOURCE[0]}" ] || here=.
cd "$here/.."

TOOLS=(podman buildah mmdebstrap)
missing=()
for tool in "${TOOLS[@]}"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
if [ "$EUID" != 0 ]; then
  # podman's chroot isolation and mmdebstrap's bases run as root here (rootless podman cannot set rlimits)
  echo "[image-test] needs root${missing[*]:+ and ${missing[*]}}: run it as root (sudo make image-test)${missing[*]:+, which installs ${missing[*]} with apt-get}" >&2
  exit 2
fi
if [ ${#missing[@]} != 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "[image-test] ${missing[*]} missing and no apt-get to install them: install the packages podman, buildah and mmdebstrap (Debian/Ubuntu: apt-get install podman buildah mmdebstrap)" >&2
    exit 2
  fi
  echo "[image-test] installing ${missing[*]} with apt-get"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# stack -> Debian suite whose own python3 the stack supports (requirements/<stack>.in, "# python:"),
# that Python, and a Java the suite has (trixie has no Java 17). tests/unit/stack/test_environment.py checks it.
declare -A SUITE=([mission]=bookworm [current]=trixie)
declare -A PYTHON=([mission]=3.11 [current]=3.13)
declare -A JAVA=([mission]=17 [current]=21)
# Like the official python:*-slim images: Debian's minbase, with the Python the venv is made from and
# the headers Horovod compiles against.
BASE_PACKAGES=python3,python3-venv,python3-dev,ca-certificates
MIRROR=http://deb.debian.org

STACKS=(${IMAGE_TEST_STACKS:-mission current})
CACHE=${IMAGE_TEST_CACHE:-/var/cache/pipelines-image-test}
OUTROOT=${IMAGE_TEST_OUT:-out-image}
[[ $OUTROOT == /* ]] || OUTROOT=$PWD/$OUTROOT
CALLER=${SUDO_UID:-0}:${SUDO_GID:-0}
IMAGE_UID=10001  # the images' user (docker/Dockerfile.cpu: useradd --uid 10001)
mkdir -p "$CACHE/bases" "$CACHE/pipelines/debs"
# pip in the image trusts what this machine trusts (where TLS to PyPI passes an intercepting proxy,
# the image's own bundle lacks its CA): a pip.conf naming the host's bundle, both mounted read-only
# into each build step and the runs, so no image holds either.
CA=${IMAGE_TEST_CA-/etc/ssl/certs/ca-certificates.crt}
MOUNTS=()
if [ -n "$CA" ]; then
  [ -r "$CA" ] || { echo "[image-test] IMAGE_TEST_CA=$CA is not a readable file (empty: the image's own CA bundle)" >&2; exit 2; }
  printf '[global]\ncert = /etc/pipelines-host-ca.pem\n' > "$CACHE/pip.conf"
  MOUNTS=(-v "$CA:/etc/pipelines-host-ca.pem:ro" -v "$CACHE/pip.conf:/etc/pip.conf:ro")
fi
summary=()
now() { date +%s; }

for stack in "${STACKS[@]}"; do
  [ -n "${SUITE[$stack]:-}" ] || { echo "[image-test] unknown stack '$stack': IMAGE_TEST_STACKS takes ${!SUITE[*]}" >&2; exit 2; }
  python3 -m pipelines.stack check "$stack" || exit 2
  read -r -a supported <<<"$(python3 -m pipelines.stack pythons "$stack")"
  [[ " ${supported[*]} " == *" ${PYTHON[$stack]} "* ]] || {
    echo "[image-test] $stack supports Python ${supported[*]}, Debian ${SUITE[$stack]} has ${PYTHON[$stack]}" >&2; exit 2; }
done

# The base of a suite: made with mmdebstrap once (the tar is cached, keyed by what makes it), imported once.
base_image() {
  local suite=$1 key tar tag
  key=$( (echo "$suite $BASE_PACKAGES $MIRROR"; declare -f base_image) | sha256sum | cut -c1-12)
  tag=localhost/pipelines-base:$suite-$key
  if podman image exists "$tag"; then echo "$tag"; return; fi
  tar=$CACHE/bases/$suite-$key.tar
  if [ ! -s "$tar" ]; then
    echo "[image-test] mmdebstrap $suite (minbase + $BASE_PACKAGES) -> $tar" >&2
    local t0; t0=$(now)
    # mmdebstrap's output format is its file's extension: the partial file ends in .tar too
    rm -rf "$tar.part.tar"
    mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" "$suite" "$tar.part.tar" \
      "deb $MIRROR/debian $suite main" "deb $MIRROR/debian $suite-updates main" \
      "deb $MIRROR/debian-security $suite-security main" >&2
    mv "$tar.part.tar" "$tar"
    echo "[image-test] base $suite made in $(( $(now) - t0 )) s" >&2
  fi
  podman import --quiet --change 'CMD ["/bin/bash"]' "$tar" "$tag" >/dev/null
  echo "$tag"
}

# The sample's Debian package, fetched on this machine: the images keep no apt lists, and their
# user cannot run apt-get update.
sample_deb() {
  local package; package=$(sed -n 's/^TUXPAINT_PACKAGE = "\(.*\)"$/\1/p' pipelines/tools/samples.py)
  compgen -G "$CACHE/pipelines/debs/${package}_*.deb" >/dev/null && return
  local mine=${PIPELINES_CACHE:-$HOME/.cache/pipelines}/debs
  if compgen -G "$mine/${package}_*.deb" >/dev/null; then cp "$mine/${package}"_*.deb "$CACHE/pipelines/debs/"; return; fi
  (cd "$CACHE/pipelines/debs" && apt-get download -q "$package")
}

build() {
  local stack=$1 base=$2 image=$3 old t0
  old=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
  t0=$(now)
  podman build --quiet --isolation chroot --network host --pull=never --layers --force-rm "${MOUNTS[@]}" \
    -f docker/Dockerfile.cpu --build-arg BASE_IMAGE="$base" --build-arg STACK="$stack" \
    --build-arg PYTHON_VERSION="${PYTHON[$stack]}" --build-arg JAVA_VERSION="${JAVA[$stack]}" \
    -t "$image" . >"$CACHE/build-$stack.log" 2>&1 \
    || { tail -40 "$CACHE/build-$stack.log" >&2; echo "[image-test] $stack: podman build failed (log: $CACHE/build-$stack.log)" >&2; return 1; }
  BUILD_S=$(( $(now) - t0 ))
  # the image this build replaced (now untagged) would only take disk; its layers stay cached
  local new; new=$(podman image inspect --format '{{.Id}}' "$image")
  if [ -n "$old" ] && [ "$old" != "$new" ]; then podman rmi "$old" >/dev/null 2>&1 || true; fi
  SIZE_MB=$(( $(podman image inspect --format '{{.Size}}' "$image") / 1000000 ))
}

# `make main` inside the image as its own user (uid 10001), with buildah's chroot isolation
# (podman run cannot set a container's rlimits in every sandbox); the outputs go to a mounted
# folder, handed back to the caller afterwards.
run_main() {
  local stack=$1 image=$2 out=$OUTROOT/$stack ctr t0 rc=0
  rm -rf "$out"; mkdir -p "$out"
  chown -R "$IMAGE_UID:$IMAGE_UID" "$out" "$CACHE/pipelines"
  # a hostname that resolves: Spark's driver looks its own up (buildah's default, the container's id, does not)
  ctr=$(buildah from --pull-never --add-host pipelines-image-test:127.0.0.1 --name "pipelines-image-test-$stack-$$" "$image")
  t0=$(now)
  buildah run --isolation chroot --network host --hostname pipelines-image-test --user pipelines "${MOUNTS[@]}" \
    -v "$out:/outputs" -v "$CACHE/pipelines:/cache" -e PIPELINES_CACHE=/cache \
    "$ctr" -- make main VENV=/opt/venv OUT=/outputs/out >"$out/main.log" 2>&1 || rc=$?
  RUN_S=$(( $(now) - t0 ))
  buildah rm "$ctr" >/dev/null
  chown -R "$CALLER" "$out"
  [ $rc = 0 ] || { tail -40 "$out/main.log" >&2; echo "[image-test] $stack: make main failed in the image ($rc; log: $out/main.log)" >&2; return 1; }
  python3 scripts/image_check.py "$out" "$CALLER"
}

status=0
for stack in "${STACKS[@]}"; do
  base=$(base_image "${SUITE[$stack]}")
  image=localhost/pipelines:cpu-$stack
  echo "[image-test] $stack: building $image on $base (Python ${PYTHON[$stack]}, Java ${JAVA[$stack]})"
  build "$stack" "$base" "$image" || { status=1; continue; }
  echo "[image-test] $stack: built in $BUILD_S s, $SIZE_MB MB"
  line="$stack: built in $BUILD_S s, $SIZE_MB MB"
  if [ "${IMAGE_TEST_RUN:-1}" != 0 ]; then
    sample_deb
    echo "[image-test] $stack: make main in the image (outputs: $OUTROOT/$stack)"
    if run_main "$stack" "$image"; then line+="; make main in $RUN_S s: $(grep '^exact test accuracy' "$OUTROOT/$stack/main.log")"
    else status=1; line+="; make main FAILED"; fi
  fi
  summary+=("$line")
done
printf '[image-test] %s\n' "${summary[@]}"
exit $status
