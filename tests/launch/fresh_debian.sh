#!/usr/bin/env bash
# The README's two commands on a bare Debian 12, as a new user runs them: a debootstrap minbase
# chroot (no CUDA, nothing but what launch/setup.sh installs), this checkout's tracked and
# non-ignored files copied to /root/ringattn (a home other users cannot enter), then
# `./launch/setup.sh demo` and `./launch/setup.sh test`. CI's machine has more installed than a
# user's, so run this whenever setup.sh, its package list or the test list changes. Needs root.
# Usage: tests/launch/fresh_debian.sh [CHROOT_DIR]   (kept between runs: debootstrap only once)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
root=${1:-/var/tmp/ringattn-fresh-debian}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ "$(id -u)" = 0 ] || { echo "fresh_debian.sh needs root (debootstrap, chroot, mounts)"; exit 77; }
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
if [ ! -x "$root/usr/bin/apt-get" ]; then
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" "$mirror"
fi
mounts=(proc sys dev dev/pts dev/shm)
cleanup() { for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "$root/${mounts[$i]}" 2>/dev/null || true; done; }
trap cleanup EXIT
for m in "${mounts[@]}"; do mkdir -p "$root/$m" && mount --bind "/$m" "$root/$m"; done
cp /etc/resolv.conf "$root/etc/resolv.conf"
# Where this machine reaches the internet through a TLS-inspecting proxy, its CA goes along (a user's
# machine needs none): into the bundle pip reads, and where update-ca-certificates keeps it.
if [ -n "$(ls /usr/local/share/ca-certificates/*.crt 2>/dev/null)" ]; then
  mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
# debootstrap writes no /etc/hosts, which an installed Debian has: without it every MPI start waits
# seconds on DNS for the host's own name.
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n' "$(hostname)" > "$root/etc/hosts"
chmod 700 "$root/root"
rm -rf "$root/root/ringattn" && mkdir -p "$root/root/ringattn"
(cd "$src" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$root/root/ringattn"
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb /bin/bash -c '
  set -e
  cd /root/ringattn
  start=$(date +%s)
  ./launch/setup.sh demo
  echo "fresh Debian 12: demo passed in $(( $(date +%s) - start )) s (apt, build, run, verify)"
  start=$(date +%s)
  ./launch/setup.sh test
  echo "fresh Debian 12: test command passed in $(( $(date +%s) - start )) s"
'
