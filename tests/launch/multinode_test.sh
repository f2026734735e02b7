#!/usr/bin/env bash
# Multi-node on one machine (issue 23): three emulated hosts, each a network namespace with its own
# address and hostname, joined by veth pairs to a bridge in a third namespace. mpirun starts on the first
# host and reaches the second through Open MPI's rsh launcher, whose agent enters that host's namespace
# instead of ssh; ranks on different hosts talk TCP across the bridge. Runs the CLI round trip with
# 2 hosts x 2 ranks from launch/hostfile.example's lines (causal zigzag ring; the dp=2,sp=2 mesh with dp
# across hosts; the ring's backward), 3 hosts x 2 ranks (a ring of 6 whose every hop but two crosses
# hosts, forward and backward), and a rank killed on the second host (every rank on both hosts exits
# non-zero in time, no output).
# Only addresses inside the namespaces made here are used; they are removed at exit, also on failure.
# Exits 77 (skipped) where namespaces cannot be made (no privilege).
# Usage: multinode_test.sh RINGATTN MPIEXEC
set -u
ra=$(readlink -f "$1"); mpiexec=$2; src=$(cd "$(dirname "$0")/../.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_orte_base_help_aggregate=0
tag=ra$$; net=10.213.$(( $$ % 200 + 20 ))
switch=$tag-sw; hosts=($tag-h1 $tag-h2 $tag-h3); addrs=($net.1 $net.2 $net.3)
dir=$(mktemp -d)
cleanup() {
  for ns in "${hosts[@]}" "$switch"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! ip netns add "$switch" 2>/dev/null; then
  echo "multinode_test: skipped: cannot create network namespaces here (needs root and iproute2)"; exit 77
fi
# Any step of the set-up refused (a container without veth or bridges): skipped, saying which.
setup() {
  set -e
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  for i in 0 1 2; do
    ns=${hosts[$i]}
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "$tag-v$i" type veth peer name eth0 netns "$ns"
    ip link set "$tag-v$i" netns "$switch"
    ip -n "$switch" link set "$tag-v$i" master br0 up
    ip -n "$ns" addr add "${addrs[$i]}/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}
if ! (setup) 2>"$dir/setup.err"; then
  echo "multinode_test: skipped: this machine refused the emulated hosts' network: $(tail -1 "$dir/setup.err")"; exit 77
fi
# The rsh agent: `agent HOST COMMAND...` runs COMMAND on HOST, i.e. in its namespace under its own hostname.
for i in 0 1 2; do printf '%s %s\n' "${addrs[$i]}" "${hosts[$i]}"; done > "$dir/hostmap"
cat > "$dir/agent" <<'AGENT'
#!/usr/bin/env bash
ns=$(awk -v h="$1" '$1 == h { print $2 }' "$(dirname "$0")/hostmap"); shift
[ -n "$ns" ] || { echo "agent: unknown host" >&2; exit 1; }
exec ip netns exec "$ns" unshare --uts bash -c 'hostname "$0"; eval "$1"' "$ns" "$*"
AGENT
# mpirun itself runs on the first host: `first_host NAMESPACE COMMAND...`.
cat > "$dir/first_host" <<'FIRST'
#!/usr/bin/env bash
ns=$1; shift
exec ip netns exec "$ns" unshare --uts bash -c 'hostname "$0"; exec "$@"' "$ns" "$@"
FIRST
chmod +x "$dir/agent" "$dir/first_host"
# The README's hostfile example, its nodes named by the emulated hosts' addresses, two slots each.
sed -e "s/^node01 /${addrs[0]} /" -e "s/^node02 /${addrs[1]} /" -e 's/slots=8/slots=2/' "$src/launch/hostfile.example" > "$dir/hosts"
printf '%s slots=2\n' "${addrs[@]}" > "$dir/hosts3"
launch=("$dir/first_host" "${hosts[0]}" "$mpiexec" --map-by ppr:2:node
     --mca plm_rsh_agent "$dir/agent" --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,vader,self
     --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" -x OMP_NUM_THREADS -x PATH
     -x LD_LIBRARY_PATH)
mpi=("${launch[@]}" --hostfile "$dir/hosts" -np 4)
mpi3=("${launch[@]}" --hostfile "$dir/hosts3" -np 6)
cd "$dir"
fails=0; passes=0
# expect NAME WANT(zero|nonzero) DEADLINE PATTERN command...
expect() {
  local name=$1 want=$2 deadline=$3 pattern=$4; shift 4
  local start out code took ok=1
  start=$(date +%s); out=$(timeout $((deadline + 30)) "$@" 2>&1); code=$?; took=$(( $(date +%s) - start ))
  if [ "$want" = zero ]; then [ $code -eq 0 ] || ok=0; else [ $code -ne 0 ] || ok=0; fi
  [ $took -le "$deadline" ] || ok=0
  grep -q -- "$pattern" <<<"$out" || ok=0
  if [ $ok -eq 1 ]; then passes=$((passes+1)); echo "ok   $name (exit $code, ${took}s)"
  else fails=$((fails+1)); echo "FAIL $name (exit $code, ${took}s, pattern '$pattern')"; echo "$out" | tail -15; fi
}
"$ra" generate --output in.h5 --batch 2 --seq 301 --heads 4 --kv-heads 2 --head-dim 32 --dtype bf16 --with-grad >/dev/null
expect "ranks on both hosts" zero 60 "${hosts[1]}" "${mpi[@]}" hostname
expect "2 hosts x 2 ranks: causal zigzag ring" zero 120 "ring (cpu) on mesh sp=4" "${mpi[@]}" "$ra" run --input in.h5 \
  --output ring.h5 --causal --layout zigzag --quiet
expect "  verify" zero 120 "#wrong 0  OK" "${mpi[@]}" "$ra" verify --input in.h5 --output ring.h5 --causal --layout zigzag
expect "dp=2,sp=2 (dp across hosts)" zero 120 "mesh dp=2,sp=2" "${mpi[@]}" "$ra" run --input in.h5 --output mesh.h5 \
  --mesh dp=2,sp=2 --causal --quiet
expect "  verify" zero 120 "#wrong 0  OK" "${mpi[@]}" "$ra" verify --input in.h5 --output mesh.h5 --mesh dp=2,sp=2 --causal
expect "the ring's backward across hosts" zero 120 "backward" "${mpi[@]}" "$ra" run --input in.h5 --output grad.h5 \
  --causal --backward --quiet
expect "  verify dq, dk, dv" zero 120 "dv vs f64 reference.*#wrong 0  OK" "${mpi[@]}" "$ra" verify --input in.h5 \
  --output grad.h5 --causal
expect "ranks on three hosts" zero 60 "${hosts[2]}" "${mpi3[@]}" hostname
expect "3 hosts x 2 ranks: causal zigzag ring" zero 120 "ring (cpu) on mesh sp=6" "${mpi3[@]}" "$ra" run --input in.h5 \
  --output ring3.h5 --causal --layout zigzag --backward --quiet
expect "  verify o, lse, dq, dk, dv" zero 120 "dv vs f64 reference.*#wrong 0  OK" "${mpi3[@]}" "$ra" verify --input in.h5 \
  --output ring3.h5 --causal --layout zigzag
# Rank 3 (on the second host) dies at step 1: every rank on both hosts ends within the timeout, no output.
expect "a rank killed on the second host" nonzero 60 "rank [012]\] ringattn: ended by signal 15" env RINGATTN_FAULT=kill:rank=3:step=1 "${mpi[@]}" \
  -x RINGATTN_FAULT "$ra" run --input in.h5 --output killed.h5 --causal --timeout 10
if [ -e killed.h5 ] || [ -e killed.h5.partial ]; then fails=$((fails+1)); echo "FAIL killed run left its output"
else passes=$((passes+1)); echo "ok   the killed run left no output"; fi
echo "multinode_test: $passes passed, $fails failed"
[ $fails -eq 0 ]
