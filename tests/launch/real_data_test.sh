#!/usr/bin/env bash
# What a new user meets with their own h5py-written files and the CLI (issue 19): every case below
# failed, crashed or was silently wrong before its fix. Errors must exit 2 on every rank with a message
# naming the cause, before any compute, and leave no output; valid inputs must run and verify.
# Usage: real_data_test.sh RINGATTN MPIEXEC
set -u
ra=$1; mpiexec=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_orte_base_help_aggregate=0
python=/usr/bin/python3; [ -x $python ] || python=python3
$python -c "import h5py" 2>/dev/null || { echo "skip: no h5py"; exit 77; }
dir=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
cd "$dir"
fails=0; passes=0
# check NAME WANT_CODE PATTERN [-r RANKS] -- command...: exit code, message, and (with -r) the message
# on every one of RANKS ranks.
check() {
  local name=$1 want=$2 pattern=$3 ranks=0; shift 3
  [ "$1" = -r ] && { ranks=$2; shift 2; }
  shift
  [ "$1" = mpi ] && { shift; set -- "$mpiexec" --oversubscribe -np "$@"; }
  local out code ok=1
  out=$(timeout 120 "$@" 2>&1); code=$?
  [ "$code" -eq "$want" ] || ok=0
  grep -q -- "$pattern" <<<"$out" || ok=0
  local r
  for ((r = 0; r < ranks; r++)); do grep -q -- "\[rank $r\] ringattn: error: .*$pattern" <<<"$out" || ok=0; done
  if [ $ok -eq 1 ]; then passes=$((passes+1)); echo "ok   $name";
  else fails=$((fails+1)); echo "FAIL $name (exit $code, wanted $want; pattern '$pattern')"; echo "$out" | grep -v "^$" | tail -6; fi
}
mpi() { "$mpiexec" --oversubscribe -np "$@"; }
no_output() {  # no_output NAME FILE: nothing under the name, nor its .partial
  if [ -e "$2" ] || [ -e "$2.partial" ]; then fails=$((fails+1)); echo "FAIL $1: output $2 left behind"; else passes=$((passes+1)); echo "ok   $1"; fi
}

$python - <<'PY'
import h5py, numpy as np
r = np.random.default_rng(0)
f32 = lambda *s: r.standard_normal(s).astype(np.float32)
def mk(name, q, k, v, **extra):
    with h5py.File(name, "w") as f:
        f["q"], f["k"], f["v"] = q, k, v
        for key, value in extra.items():
            f[key] = value
mk("in.h5", f32(1, 97, 4, 32), f32(1, 97, 2, 32), f32(1, 97, 2, 32))
mk("sne.h5", f32(1, 53, 4, 32), f32(1, 97, 1, 32), f32(1, 97, 1, 32))        # S != T, MQA
mk("tiny.h5", f32(1, 3, 2, 16), f32(1, 3, 2, 16), f32(1, 3, 2, 16))          # fewer tokens than ranks
mk("one.h5", f32(2, 1, 4, 32), f32(2, 40, 4, 32), f32(2, 40, 4, 32))         # T = 1: decoding
for dim, shape in [("T", (1, 0, 4, 32)), ("B", (0, 8, 4, 32)), ("H", (1, 8, 0, 32)), ("D", (1, 8, 4, 0))]:
    kv = list(shape); kv[1] = 8 if dim != "T" else 0
    mk(f"zero_{dim}.h5", np.zeros(shape, np.float32), np.zeros(kv, np.float32), np.zeros(kv, np.float32))
mk("zero_S.h5", f32(1, 8, 4, 32), np.zeros((1, 0, 4, 32), np.float32), np.zeros((1, 0, 4, 32), np.float32))
docs = np.repeat(np.array([0, 1, 2, 3]), [5, 9, 1, 8])[None]
qkv = f32(2, 23, 4, 32), f32(2, 23, 2, 32), f32(2, 23, 2, 32)
mk("i64seg.h5", *qkv, do=f32(2, 23, 4, 32), segment_ids=np.repeat(docs, 2, 0) * 10**6)
mk("u8seg.h5", *qkv, segment_ids=np.repeat(docs, 2, 0).astype(np.uint8))
mk("i32seg.h5", *qkv, segment_ids=np.repeat(docs, 2, 0).astype(np.int32))
mk("f64seg.h5", f32(1, 16, 4, 32), f32(1, 16, 4, 32), f32(1, 16, 4, 32), segment_ids=np.zeros((1, 16)))
mk("hugeseg.h5", f32(1, 16, 4, 32), f32(1, 16, 4, 32), f32(1, 16, 4, 32), segment_ids=np.full((1, 16), 2**40))
mk("i64q.h5", r.integers(0, 3, (1, 16, 4, 32)), f32(1, 16, 4, 32), f32(1, 16, 4, 32))
bits = lambda *s: r.integers(0, 65535, s).astype(np.uint16)  # bfloat16 bits as numpy holds them
mk("bits.h5", bits(1, 16, 4, 32), bits(1, 16, 2, 32), bits(1, 16, 2, 32))
with h5py.File("unwritten.h5", "w") as f:  # q created, never assigned: HDF5 would read zeros
    f.create_dataset("q", shape=(1, 16, 4, 32), dtype=np.float32)
    f["k"], f["v"] = f32(1, 16, 2, 32), f32(1, 16, 2, 32)
with h5py.File("foreign_in.h5", "w") as f:  # for another library's outputs, checked by verify
    f["q"], f["k"], f["v"], f["do"] = f32(1, 37, 4, 16), f32(1, 37, 2, 16), f32(1, 37, 2, 16), f32(1, 37, 4, 16)
with h5py.File("filtered.h5", "w") as f:  # whole, compressed: HDF5 calls its storage partly allocated
    f.create_dataset("q", data=f32(2, 67, 4, 16), compression="gzip", shuffle=True, fletcher32=True, chunks=(1, 16, 4, 16))
    f.create_dataset("k", data=f32(2, 67, 4, 16), scaleoffset=3, chunks=(1, 16, 4, 16))
    f.create_dataset("v", data=f32(2, 67, 4, 16), external=[("filtered_v.bin", 0, h5py.h5f.UNLIMITED)])
with h5py.File("mask_fill.h5", "w") as f:  # a mask written in part over a fill value chosen for the rest: valid
    f["q"], f["k"], f["v"] = f32(1, 16, 4, 32), f32(1, 16, 2, 32), f32(1, 16, 2, 32)
    f.create_dataset("mask", shape=(16, 16), dtype=np.uint8, chunks=(4, 16), fillvalue=1)[:4] = 0
with h5py.File("half_written.h5", "w") as f:  # half of q's chunks written (over MPI-IO the other half failed the read)
    f.create_dataset("q", shape=(1, 16, 4, 32), dtype=np.float32, chunks=(1, 4, 4, 32))[:, :8] = f32(1, 8, 4, 32)
    f["k"], f["v"] = f32(1, 16, 2, 32), f32(1, 16, 2, 32)
v = f32(1, 16, 4, 32); v[0, 3, 1, 5] = np.nan
mk("nan_v.h5", f32(1, 16, 4, 32), f32(1, 16, 4, 32), v)
with h5py.File("lzf.h5", "w") as f:
    f.create_dataset("q", data=f32(1, 16, 4, 32), compression="lzf")
    f["k"], f["v"] = f32(1, 16, 4, 32), f32(1, 16, 4, 32)
for i in range(2):
    with h5py.File(f"part{i}.h5", "w") as f:
        f["x"] = f32(1, 8, 4, 32)
layout = h5py.VirtualLayout(shape=(1, 16, 4, 32), dtype=np.float32)
for i in range(2):
    layout[:, 8 * i:8 * i + 8] = h5py.VirtualSource(f"part{i}.h5", "x", shape=(1, 8, 4, 32))
with h5py.File("vds.h5", "w") as f:
    f.create_virtual_dataset("q", layout)
    f["k"], f["v"] = f32(1, 16, 4, 32), f32(1, 16, 4, 32)
with h5py.File("huge.h5", "w") as f:  # claims 2^40 keys, stores nothing
    f["q"] = f32(1, 16, 4, 32)
    for name in ("k", "v"):
        f.create_dataset(name, shape=(1, 2**40, 4, 32), dtype=np.float32, chunks=(1, 1024, 4, 32))
with h5py.File("groups.h5", "w") as f:
    g = f.create_group("layer3/attn")
    g["q"], g["k"], g["v"] = f32(1, 40, 4, 32), f32(1, 40, 4, 32), f32(1, 40, 4, 32)
PY

# 1. Bare words and option prefixes.
check bare-word-refused 2 "unexpected argument 'causal' (did you mean --causal?)" -- "$ra" run --input in.h5 --output x.h5 causal
check ambiguous-prefix-refused 2 "unrecognised option '--no'" -- "$ra" run --input in.h5 --output x.h5 --no
check prefix-not-completed 2 "unrecognised option '--caus'" -- "$ra" run --input in.h5 --output x.h5 --caus
# Boost loops forever formatting an error about text that holds its own placeholders (fuzzing found it).
check placeholder-in-option 2 "cannot be parsed" -- "$ra" run --input in.h5 --output x.h5 --%option%
check placeholder-in-value 2 "cannot be parsed" -- "$ra" run --input in.h5 --output x.h5 --softcap %value%
no_output bare-words-wrote-nothing x.h5
# 2. The output is the input, by any path.
before=$(md5sum < in.h5)
ln in.h5 hardlink.h5; ln -s "$dir/in.h5" symlink.h5
check output-is-input 2 "is the input file" -r 2 -- mpi 2 "$ra" run --input in.h5 --output in.h5 --overwrite
check output-is-input-hardlink 2 "is the input file" -- "$ra" run --input in.h5 --output hardlink.h5 --overwrite
check output-is-input-symlink 2 "is the input file" -- "$ra" run --input "$dir/./in.h5" --output symlink.h5 --overwrite
[ "$before" = "$(md5sum < in.h5)" ] && { passes=$((passes+1)); echo "ok   input-unchanged"; } || { fails=$((fails+1)); echo "FAIL input-unchanged"; }
# 3. Outputs that are not regular files.
mkfifo fifo.h5; mkdir outdir; ln -s /dev/null devnull.h5
check output-fifo 2 "is not a regular file" -- "$ra" run --input in.h5 --output fifo.h5 --overwrite
check output-device-via-symlink 2 "is not a regular file" -- "$ra" run --input in.h5 --output devnull.h5 --overwrite
[ -c /dev/null ] && { passes=$((passes+1)); echo "ok   dev-null-still-a-device"; } || { fails=$((fails+1)); echo "FAIL /dev/null replaced"; }
check output-directory-up-front 2 "is a directory: name a file" -r 2 -- mpi 2 "$ra" run --input in.h5 --output outdir --overwrite
# 4. Zero-length dimensions, any implementation, any number of ranks.
for dim in T B H D S; do
  check "zero-$dim-ring-1" 2 "is 0, expected at least 1" -- "$ra" run --input zero_$dim.h5 --output x.h5
  check "zero-$dim-ring-2" 2 "is 0, expected at least 1" -r 2 -- mpi 2 "$ra" run --input zero_$dim.h5 --output x.h5
done
for impl in sdpa flash_attn2 blockwise; do
  check "zero-T-$impl" 2 "dimension 1 of (batch, q_len, q_heads, head_dim) is 0" -- "$ra" run --input zero_T.h5 --output x.h5 --impl $impl
done
no_output zero-dims-wrote-nothing x.h5
# 5. + sequences as users have them: T = 1, odd T, T < ranks, S != T, every layout, 1 to 4 ranks.
for layout in contiguous zigzag striped; do
  for n in 1 2 3 4; do
    for causal in "" --causal; do
      for file in in sne tiny one; do
        name="$file-$layout-$n${causal:+-causal}"
        # verify on one process: its reference does not depend on the ranks that wrote the file
        if timeout 60 "$mpiexec" --oversubscribe -np $n "$ra" run --input $file.h5 --output "$name.h5" --layout $layout \
             $causal --window 30,-1 --quiet >/dev/null 2>&1 &&
           timeout 60 "$ra" verify --input $file.h5 --output "$name.h5" --layout $layout $causal --window 30,-1 2>&1 |
             grep -q "#wrong 0  OK"; then
          passes=$((passes+1))
        else
          fails=$((fails+1)); echo "FAIL uneven $name"
        fi
      done
    done
  done
done
echo "ok   uneven shards: 96 run + verify pairs done (failures listed above)"
check causal-T1-default-layout 0 "layout zigzag" -- "$ra" run --input one.h5 --output one_causal.h5 --causal
# 6. Valid files HDF5 reads differently: a missing filter is named, a virtual dataset reads on 2 ranks.
check lzf-filter-named 2 "compressed with HDF5 filter 32000 (lzf" -r 2 -- mpi 2 "$ra" run --input lzf.h5 --output x.h5
check virtual-dataset-2-ranks 0 "ringattn run: ring" -- mpi 2 "$ra" run --input vds.h5 --output vds_out.h5
check virtual-dataset-verify 0 "#wrong 0  OK" -- mpi 2 "$ra" verify --input vds.h5 --output vds_out.h5
mv part1.h5 part1.moved
check virtual-source-missing 2 "source file 'part1.h5' is missing" -- "$ra" run --input vds.h5 --output x.h5
mv part1.moved part1.h5
# 7. --allow-nonfinite: the output is written, its non-finite values reported.
check nonfinite-refused 2 "holds 1 NaN or Inf" -- mpi 2 "$ra" run --input nan_v.h5 --output nan_out.h5
check nonfinite-allowed-written 0 "the output holds [1-9][0-9]* NaN or Inf values in o" -- mpi 2 "$ra" run --input nan_v.h5 --output nan_out.h5 --allow-nonfinite
[ -f nan_out.h5 ] && { passes=$((passes+1)); echo "ok   nonfinite-output-exists"; } || { fails=$((fails+1)); echo "FAIL nonfinite output missing"; }
# 8. Shapes that cannot fit: refused by name before any allocation, on every rank.
check huge-claimed-shape 2 "'k' slice (1, 549755813888, 4, 32) f32" -r 2 -- mpi 2 "$ra" run --input huge.h5 --output x.h5
# 9. A file open for writing elsewhere.
$python -c "import h5py, time; f = h5py.File('locked.h5', 'w'); f['q'] = [1.0]; f.flush(); open('locked.ready', 'w'); time.sleep(120)" &
for _ in $(seq 600); do [ -e locked.ready ] && break; sleep 0.1; done  # (up to 60 s: h5py's import on a loaded machine)
check locked-file 2 "it is locked: another process holds it open for writing" -- "$ra" run --input locked.h5 --output x.h5
kill %1 2>/dev/null
# Not HDF5, or cut short: said so, not taken for a lock ("superblock" holds "lock").
echo "q,k,v" > text.h5
check not-hdf5 2 "'text.h5' for reading: it is not an HDF5 file" -- "$ra" run --input text.h5 --output x.h5
head -c 2000 in.h5 > cut.h5
check truncated-file 2 "'cut.h5' for reading: it is truncated" -- "$ra" run --input cut.h5 --output x.h5
# 10. Datatypes: what was found, what is expected.
# Segment ids of any integer type (numpy's and torch's int64), as Python's API and cu_seqlens take them; compared as int32.
check int64-segment-ids 0 "ringattn run: ring" -- mpi 3 "$ra" run --input i64seg.h5 --output i64seg_out.h5 --causal --backward
check int64-segment-ids-verified 0 "dv vs f64 reference: .*#wrong 0  OK" -- mpi 2 "$ra" verify --input i64seg.h5 \
  --output i64seg_out.h5 --causal
check uint8-segment-ids 0 "ringattn run: ring" -- "$ra" run --input u8seg.h5 --output u8seg_out.h5 --causal
check int32-segment-ids 0 "ringattn run: ring" -- "$ra" run --input i32seg.h5 --output i32seg_out.h5 --causal
check segment-ids-any-width-alike 0 "same" -- $python -c "
import h5py, numpy as np
o = [h5py.File(n + '_out.h5')['o'][...] for n in ('i64seg', 'u8seg', 'i32seg')]
assert np.allclose(o[0], o[1], atol=1e-6) and np.array_equal(o[1], o[2]); print('same')"
check float-segment-ids 2 "dataset 'segment_ids' of 'f64seg.h5' holds float64, expected integers" -- "$ra" run \
  --input f64seg.h5 --output x.h5
check huge-segment-ids 2 "dataset 'segment_ids' of 'hugeseg.h5' holds 1099511627776 (int64), outside int32's range" -r 2 \
  -- mpi 2 "$ra" run --input hugeseg.h5 --output x.h5
check never-written 2 "dataset 'q' of 'unwritten.h5' was created but never written" -r 2 -- mpi 2 "$ra" run --input unwritten.h5 --output x.h5
check partly-written 2 "dataset 'q' of 'half_written.h5' is only partly written: 2 of its 4 chunks" -r 2 -- mpi 2 "$ra" run --input half_written.h5 --output x.h5
no_output partly-written-no-output x.h5
check filtered-whole-3-ranks 0 "ringattn run: ring" -- mpi 3 "$ra" run --input filtered.h5 --output filtered_out.h5 --causal
check filtered-whole-verify 0 "#wrong 0  OK" -- mpi 3 "$ra" verify --input filtered.h5 --output filtered_out.h5 --causal
# Another library's outputs (h5py, no manifest): checked by value against the options given to verify.
"$ra" run --input foreign_in.h5 --output foreign_ours.h5 --causal --backward --quiet >/dev/null 2>&1
$python - <<'PY'
import h5py, numpy as np
with h5py.File("foreign_in.h5") as f:
    q, k, v = (np.repeat(f[n][...].astype(np.float64), 2 if n != "q" else 1, axis=2) for n in ("q", "k", "v"))
s = np.einsum("bthd,bshd->bhts", q, k) / 4.0
s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
m = s.max(-1, keepdims=True)
lse = m + np.log(np.exp(s - m).sum(-1, keepdims=True))
o = np.einsum("bhts,bshd->bthd", np.exp(s - lse), v)
def write(name, **sets):
    with h5py.File(name, "w") as g:
        for key, value in sets.items():
            g[key] = value
write("foreign_numpy.h5", o=o.astype(np.float32), lse=lse[..., 0].astype(np.float32))
write("foreign_o_only.h5", o=o.astype(np.float32))
bad = o.astype(np.float32); bad[0, 5, 1, 3] += 0.5
write("foreign_wrong.h5", o=bad, lse=lse[..., 0].astype(np.float32))
write("foreign_f64.h5", o=o, lse=lse[..., 0])
with h5py.File("foreign_ours.h5") as src, h5py.File("foreign_grads.h5", "w") as g:  # run's datasets, no attributes
    for key in src:
        g[key] = src[key][...]
PY
check foreign-output-named 0 "'foreign_numpy.h5' has no manifest (not written by ringattn run)" -- mpi 2 "$ra" verify --input foreign_in.h5 --output foreign_numpy.h5 --causal
check foreign-output-verified 0 "#wrong 0  OK" -- mpi 2 "$ra" verify --input foreign_in.h5 --output foreign_numpy.h5 --causal
check foreign-output-o-only 0 "it has no lse: o only" -- "$ra" verify --input foreign_in.h5 --output foreign_o_only.h5 --causal
check foreign-output-wrong 1 "#wrong 1  FAILED" -- "$ra" verify --input foreign_in.h5 --output foreign_wrong.h5 --causal
check foreign-output-f64 2 "dataset 'o' of 'foreign_f64.h5' holds float64, expected float32, float16 or bfloat16" -- "$ra" verify --input foreign_in.h5 --output foreign_f64.h5 --causal
check foreign-gradients-verified 0 "dv vs f64 reference: .*#wrong 0  OK" -- mpi 3 "$ra" verify --input foreign_in.h5 --output foreign_grads.h5 --causal
check partly-written-chosen-fill 0 "ringattn run: ring" -- mpi 2 "$ra" run --input mask_fill.h5 --output mask_fill_out.h5
check partly-written-chosen-fill-verify 0 "#wrong 0  OK" -- mpi 2 "$ra" verify --input mask_fill.h5 --output mask_fill_out.h5
check bf16-bits-as-uint16 2 "holds uint16, expected .*bfloat16 bits stored as integers?" -- "$ra" run --input bits.h5 --output x.h5
check int64-q 2 "dataset 'q' of 'i64q.h5' holds int64, expected float32, float16 or bfloat16" -- "$ra" run --input i64q.h5 --output x.h5
# 11. --io-timeout as --timeout.
check io-timeout-zero 2 "--io-timeout is 0, expected a positive integer" -- "$ra" run --input in.h5 --output x.h5 --io-timeout 0
check io-timeout-negative 2 "--io-timeout is -5, expected a positive integer" -- "$ra" run --input in.h5 --output x.h5 --io-timeout -5
# 13. Help lists what this build runs.
help=$("$ra" run --help | tr -s ' \n' ' ')
for impl in blockwise flash_attn2 ring sdpa; do
  grep -q "implementation: .*$impl" <<<"$help" && passes=$((passes+1)) || { fails=$((fails+1)); echo "FAIL help lacks $impl"; }
done
if ldd "$ra" | grep -q libcudnn; then  # a build with cudnn says so in both lists
  grep -q "implementation: .*cudnn" <<<"$help" && grep -q "local kernel: .*cudnn" <<<"$help" && passes=$((passes+1)) ||
    { fails=$((fails+1)); echo "FAIL help lacks cudnn"; }
fi
# Dataset paths inside the file; a named optional dataset must exist.
check dataset-paths 0 "ringattn run: ring" -- mpi 2 "$ra" run --input groups.h5 --output g.h5 --causal \
  --q-dataset /layer3/attn/q --k-dataset layer3/attn/k --v-dataset /layer3/attn/v
check dataset-paths-verify 0 "#wrong 0  OK" -- mpi 2 "$ra" verify --input groups.h5 --output g.h5 --causal \
  --q-dataset /layer3/attn/q --k-dataset layer3/attn/k --v-dataset /layer3/attn/v
check named-mask-missing 2 "--mask-dataset names dataset '/layer3/mask'" -- "$ra" run --input groups.h5 --output x.h5 \
  --q-dataset /layer3/attn/q --k-dataset layer3/attn/k --v-dataset /layer3/attn/v --mask-dataset /layer3/mask
check dataset-missing 2 "has no dataset '/layer3/attn/x'" -- "$ra" run --input groups.h5 --output x.h5 --q-dataset /layer3/attn/x
# A missing dataset's refusal says what the file holds, and which path names one of that name in a group.
check dataset-missing-lists-the-file 2 "has no dataset 'q' .*; it holds layer3/attn/k, layer3/attn/q, layer3/attn/v \
(a dataset in a group is named by its path: 'layer3/attn/q'" -r 2 -- mpi 2 "$ra" run --input groups.h5 --output x.h5
no_output dataset-missing-no-output x.h5
# Progress on long work: rank 0, stderr, off with --quiet.
check progress-lines 0 "ring step 2 of 2" -- mpi 2 "$ra" run --input in.h5 --output p.h5 --causal
if mpi 2 "$ra" run --input in.h5 --output p.h5 --causal --overwrite --quiet 2>&1 | grep -q "ring step"; then
  fails=$((fails+1)); echo "FAIL quiet still prints progress"
else passes=$((passes+1)); echo "ok   quiet"; fi
# 14. A mask or bias of fewer than 4 dimensions broadcasts as numpy's does (PyTorch's (T, S) attn_mask, a (S,)
# key-padding mask): the same results as its 4-dimensional form, dbias written in the file's shape, verified.
$python - <<'PY'
import h5py, numpy as np
r = np.random.default_rng(5)
f32 = lambda *s: r.standard_normal(s).astype(np.float32)
q, k, v, do = f32(2, 45, 4, 16), f32(2, 37, 2, 16), f32(2, 37, 2, 16), f32(2, 45, 4, 16)
for name, key, value in [("m2", "mask", r.random((45, 37)) > 0.3), ("m1", "mask", r.random(37) > 0.3),
                         ("b2", "bias", f32(45, 37)), ("b1", "bias", f32(37)), ("b3", "bias", f32(4, 1, 37))]:
    for suffix, data in (("", value), ("_4d", value.reshape((1,) * (4 - value.ndim) + value.shape))):
        with h5py.File(f"{name}{suffix}.h5", "w") as f:
            f["q"], f["k"], f["v"], f["do"], f[key] = q, k, v, do, data
with h5py.File("b2_bad.h5", "w") as f:
    f["q"], f["k"], f["v"], f["bias"] = q, k, v, f32(45, 3)
PY
for name in m2 m1 b2 b1 b3; do
  check "broadcast-$name" 0 "ringattn run: ring" -- mpi 3 "$ra" run --input $name.h5 --output ${name}_out.h5 --causal --backward
  check "broadcast-$name-4d" 0 "ringattn run: ring" -- mpi 3 "$ra" run --input ${name}_4d.h5 --output ${name}_4d_out.h5 --causal --backward
  check "broadcast-$name-verify" 0 "#wrong 0  OK" -- mpi 3 "$ra" verify --input $name.h5 --output ${name}_out.h5 --causal
  if $python - "$name" <<'PY'
import sys, h5py, numpy as np
name = sys.argv[1]
with h5py.File(f"{name}.h5") as i, h5py.File(f"{name}_out.h5") as a, h5py.File(f"{name}_4d_out.h5") as b:
    for key in ("o", "lse", "dq", "dk", "dv"):
        assert np.array_equal(a[key][...], b[key][...]), key
    if "dbias" in b:
        assert a["dbias"].shape == i["bias"].shape, (a["dbias"].shape, i["bias"].shape)
        assert np.array_equal(a["dbias"][...], b["dbias"][...].reshape(a["dbias"].shape)), "dbias"
PY
  then passes=$((passes+1)); echo "ok   broadcast-$name-equals-4d"; else fails=$((fails+1)); echo "FAIL broadcast-$name-equals-4d"; fi
done
check broadcast-bad-dim 2 "dataset 'bias' of 'b2_bad.h5' has shape (45, 3): dimension 1 is 3, expected 1 or 37" -r 2 -- \
  mpi 2 "$ra" run --input b2_bad.h5 --output x.h5
# 15. Dropout on a mesh: each dp / tp rank keys its decisions by global batch and head (they used local
# indices, so the mesh dropped other pairs than one rank and `verify` failed every dataset).
"$ra" generate --output drop.h5 --batch 2 --seq 40 --heads 4 --kv-heads 2 --head-dim 16 --with-grad >/dev/null
for mesh in dp=2,sp=2 tp=2,sp=2; do
  check "dropout-mesh-$mesh" 0 "ringattn run: ring" -- mpi 4 "$ra" run --input drop.h5 --output drop_$mesh.h5 --dropout 0.3 \
    --mesh $mesh --backward
  check "dropout-mesh-$mesh-verify" 0 "dv vs f64 reference: .*#wrong 0  OK" -- mpi 2 "$ra" verify --input drop.h5 \
    --output drop_$mesh.h5 --dropout 0.3
done
# 16. NaN / Inf counted once where several ranks hold the same part (sinks on every sequence rank, a bias's
# broadcast dimensions, a kv head the tp ranks share): the message gives the file's count (it summed every rank's copy).
$python - <<'PY'
import h5py, numpy as np
r = np.random.default_rng(6)
f32 = lambda *s: r.standard_normal(s).astype(np.float32)
sinks, bias = f32(4), f32(40, 40)
sinks[1], bias[7, 3] = np.inf, np.nan
k = f32(2, 40, 1, 16)
k[1, 5, 0, 2] = np.nan
with h5py.File("nan_shared_k.h5", "w") as f:  # one kv head that the tp ranks share
    f["q"], f["k"], f["v"] = f32(2, 40, 4, 16), k, f32(2, 40, 1, 16)
with h5py.File("inf_sinks.h5", "w") as f:
    f["q"], f["k"], f["v"], f["sinks"] = f32(2, 40, 4, 16), f32(2, 40, 2, 16), f32(2, 40, 2, 16), sinks
with h5py.File("nan_bias.h5", "w") as f:
    f["q"], f["k"], f["v"], f["bias"] = f32(2, 40, 4, 16), f32(2, 40, 2, 16), f32(2, 40, 2, 16), bias
PY
check nonfinite-sinks-counted-once 2 "dataset 'sinks' holds 1 NaN or +Inf values (-inf, which is no sink, is taken);" -r 3 \
  -- mpi 3 "$ra" run --input inf_sinks.h5 --output x.h5
# A sink of -inf is no sink (a head without one, as files with per-head sinks write it): taken, and its head's rows are
# those of the same file without sinks, a fully masked row's too (o = 0, lse = -inf, no NaN), the gradients verified.
$python - <<'PY'
import h5py, numpy as np
r = np.random.default_rng(16)
f32 = lambda *s: r.standard_normal(s).astype(np.float32)
q, k, v, do = f32(2, 33, 4, 16), f32(2, 33, 2, 16), f32(2, 33, 2, 16), f32(2, 33, 4, 16)
mask = np.ones((2, 1, 33, 33), bool)
mask[:, :, 20] = False  # a fully masked query row
for name, extra in (("no_sink.h5", {"sinks": np.array([0.3, -np.inf, 1.0, -np.inf], np.float32)}), ("sinkless.h5", {})):
    with h5py.File(name, "w") as f:
        f["q"], f["k"], f["v"], f["do"], f["mask"] = q, k, v, do, mask
        for key, value in extra.items():
            f[key] = value
PY
check minus-inf-sinks-taken 0 "ringattn run: ring" -- mpi 3 "$ra" run --input no_sink.h5 --output no_sink_out.h5 --causal \
  --backward
"$ra" run --input sinkless.h5 --output sinkless_out.h5 --causal --backward --quiet >/dev/null 2>&1
check minus-inf-sinks-verified 0 "dsinks vs f64 reference: .*#wrong 0  OK" -- mpi 2 "$ra" verify --input no_sink.h5 \
  --output no_sink_out.h5 --causal
check minus-inf-sink-is-no-sink 0 "same" -- $python -c "
import h5py, numpy as np
a, b = h5py.File('no_sink_out.h5'), h5py.File('sinkless_out.h5')
for h in (1, 3):
    assert np.allclose(a['o'][:, :, h], b['o'][:, :, h], atol=1e-6) and np.allclose(a['lse'][:, h], b['lse'][:, h], atol=1e-6)
    assert np.allclose(a['dq'][:, :, h], b['dq'][:, :, h], atol=1e-6)
assert np.all(a['o'][:, 20] == 0) and np.all(np.isneginf(a['lse'][:, 1::2, 20])) and np.all(a['lse'][:, 0::2, 20] > -1e9)
assert a['dsinks'][1] == 0 and a['dsinks'][3] == 0 and not np.isnan(a['dq'][...]).any()
print('same')"
check nonfinite-bias-counted-once 2 "dataset 'bias' holds 1 NaN or +Inf values (-inf, which hides its pair, is taken);" -r 4 -- mpi 4 "$ra" run --input nan_bias.h5 --output x.h5 \
  --mesh dp=2,sp=2
check nonfinite-shared-kv-head-counted-once 2 "dataset 'k' holds 1 NaN or Inf values;" -r 4 -- mpi 4 "$ra" run \
  --input nan_shared_k.h5 --output x.h5 --mesh tp=2,sp=2
# dbias of a bias every sequence rank shares (an (S) bias): one changed element is one wrong element, not one a rank.
if $python -c "import h5py; f = h5py.File('b1_out.h5', 'a'); f['dbias'][5] += 1.0"; then
  check verify-dbias-wrong-counted-once 1 "dbias vs f64 reference: .*#wrong 1  FAILED" -- mpi 3 "$ra" verify --input b1.h5 \
    --output b1_out.h5 --causal
fi
# FlashAttention's packed sequences: cu_seqlens (numpy's int64, or any integer type under another name) are read
# as the segment ids they imply, equal to those; bad bounds refused by name on every rank. Datasets run reads none
# of (an HF-style attention_mask) are named in a note, not ignored without a word.
$python - <<'PY'
import h5py, numpy as np
r = np.random.default_rng(7)
f32 = lambda *s: r.standard_normal(s).astype(np.float32)
q, k, v, do = f32(1, 61, 4, 16), f32(1, 61, 2, 16), f32(1, 61, 2, 16), f32(1, 61, 4, 16)
lengths = [9, 0, 30, 1, 21]
cu = np.concatenate([[0], np.cumsum(lengths)])
def mk(name, **extra):
    with h5py.File(name, "w") as f:
        f["q"], f["k"], f["v"], f["do"] = q, k, v, do
        for key, value in extra.items():
            f[key] = value
mk("cu.h5", cu_seqlens=cu)
mk("cu_seg.h5", segment_ids=np.repeat(np.arange(len(lengths)), lengths)[None].astype(np.int32))
mk("cu_grouped.h5", **{"packed/bounds": cu.astype(np.uint16), "attention_mask": np.ones((1, 61), np.int64)})
mk("cu_both.h5", cu_seqlens=cu, segment_ids=np.zeros((1, 61), np.int32))
mk("cu_decreasing.h5", cu_seqlens=np.array([0, 30, 20, 61]))
mk("cu_short.h5", cu_seqlens=np.array([0, 30, 60]))
mk("cu_float.h5", cu_seqlens=cu.astype(np.float64))
with h5py.File("cu_batch2.h5", "w") as f:
    f["q"], f["k"], f["v"], f["cu_seqlens"] = f32(2, 8, 2, 16), f32(2, 8, 2, 16), f32(2, 8, 2, 16), np.array([0, 3, 8])
with h5py.File("padding.h5", "w") as f:  # Hugging Face's (batch, kv_len) attention_mask, stored as it is
    f["q"], f["k"], f["v"], f["attention_mask"] = f32(2, 8, 2, 16), f32(2, 9, 2, 16), f32(2, 9, 2, 16), np.ones((2, 9), bool)
PY
check cu-seqlens-3-ranks-backward 0 "ringattn run: ring" -- mpi 3 "$ra" run --input cu.h5 --output cu_out.h5 --causal --backward
check cu-seqlens-verify 0 "dv vs f64 reference: .*#wrong 0  OK" -- mpi 2 "$ra" verify --input cu.h5 --output cu_out.h5 --causal
check cu-seqlens-as-segment-ids 0 "ringattn run: ring" -- "$ra" run --input cu_seg.h5 --output cu_seg_out.h5 --causal --backward
check cu-seqlens-equal-segment-ids 0 "equal" -- $python -c "
import h5py, numpy as np
a, b = h5py.File('cu_out.h5', 'r'), h5py.File('cu_seg_out.h5', 'r')
worst = max(float(np.abs(a[n][...] - b[n][...]).max()) for n in ('o', 'lse', 'dq', 'dk', 'dv'))
print('equal' if worst < 1e-5 else 'differ by %g' % worst)"
check cu-seqlens-ignored-without-it-fails 1 "#wrong [1-9]" -- "$ra" verify --input cu_grouped.h5 --output cu_out.h5 --causal
check cu-seqlens-named-any-integer 0 "#wrong 0  OK" -- "$ra" verify --input cu_grouped.h5 --output cu_out.h5 --causal \
  --cu-seqlens-dataset packed/bounds
check unread-dataset-noted 0 "note: 'cu_grouped.h5' also holds 'attention_mask', which run does not read" -- "$ra" run \
  --input cu_grouped.h5 --output cu_note.h5 --cu-seqlens-dataset packed/bounds
check cu-seqlens-and-segment-ids 2 "are both given: give one" -r 2 -- mpi 2 "$ra" run --input cu_both.h5 --output x.h5
check cu-seqlens-decreasing 2 "dataset 'cu_seqlens' of 'cu_decreasing.h5' decreases at entry 2 (20 after 30)" -r 2 -- \
  mpi 2 "$ra" run --input cu_decreasing.h5 --output x.h5
check cu-seqlens-short 2 "ends at 60, expected q's seq_len 61" -- "$ra" run --input cu_short.h5 --output x.h5
check cu-seqlens-float 2 "holds float64, expected integers" -- "$ra" run --input cu_float.h5 --output x.h5
check cu-seqlens-batch-2 2 "packs the sequences of one batch row, but q's batch is 2" -- "$ra" run --input cu_batch2.h5 \
  --output x.h5
check padding-mask-shape-hinted 2 "is stored as (batch, 1, 1, kv_len)" -- "$ra" run --input padding.h5 --output x.h5 \
  --mask-dataset attention_mask
# 17. Options that shape only some implementations' work, given where they would change nothing: refused by
# name on every rank (they ran as if left out), as is --dropout-seed without --dropout and a bf16 gradient wire
# beside the host ring's deterministic sums (exact fixed point on its wire).
check block-q-not-blockwise 2 "\-\-block-q applies to --impl blockwise" -r 2 -- mpi 2 "$ra" run --input in.h5 --output x.h5 \
  --block-q 32
check block-k-not-blockwise 2 "\-\-block-k applies to --impl blockwise" -- "$ra" run --input in.h5 --output x.h5 \
  --impl flash_attn2 --block-k 32
check block-q-blockwise 0 "ringattn run: blockwise" -- "$ra" run --input in.h5 --output bw.h5 --impl blockwise --block-q 32 \
  --block-k 16 --quiet
check local-impl-not-ring 2 "\-\-local-impl applies to --impl ring" -- "$ra" run --input in.h5 --output x.h5 --impl sdpa \
  --local-impl sdpa
check layout-not-ring 2 "\-\-layout applies to --impl ring" -- "$ra" verify --input in.h5 --output bw.h5 --impl blockwise \
  --layout zigzag
check checksums-not-ring 2 "\-\-no-block-checksums applies to --impl ring" -- "$ra" run --input in.h5 --output x.h5 \
  --impl flash_attn2 --no-block-checksums
check transport-host-ring 2 "\-\-ring-transport applies to the GPU ring" -r 2 -- mpi 2 "$ra" run --input in.h5 \
  --output x.h5 --ring-transport nccl
check grad-wire-not-ring 2 "\-\-grad-wire applies to --impl ring" -- "$ra" run --input foreign_in.h5 --output x.h5 \
  --impl sdpa --backward --grad-wire bf16
check dropout-seed-alone 2 "\-\-dropout-seed 7 without --dropout" -r 2 -- mpi 2 "$ra" run --input in.h5 --output x.h5 \
  --dropout-seed 7
check do-dataset-default-named 2 "\\-\\-do-dataset applies to the backward pass, where it would change nothing without it: add --backward" -- "$ra" run --input foreign_in.h5 \
  --output x.h5 --do-dataset do
check deterministic-bf16-wire 2 "gradient wire bf16 with deterministic on the host ring" -r 2 -- mpi 2 "$ra" run \
  --input foreign_in.h5 --output x.h5 --backward --deterministic --grad-wire bf16
# A bias that hides pairs as PyTorch's float attn_mask does (-inf), or as HF writes masks (-1e9): -inf is taken
# without --allow-nonfinite, and neither loosens verify (the largest |bias| made every tolerance infinite, passing
# any output); rows whose keys -1e9 hides all alike are named as ones f32 cannot resolve. A float mask of 0 / -inf
# under the name "mask" is refused with the way to read it as the bias it is.
$python - <<'PY'
import h5py, numpy as np
r = np.random.default_rng(7)
f32 = lambda *s: r.standard_normal(s).astype(np.float32)
q, k, v, do = f32(1, 48, 4, 16), f32(1, 48, 2, 16), f32(1, 48, 2, 16), f32(1, 48, 4, 16)
hidden = r.random((4, 48, 48)) < 0.3
lowest = np.finfo(np.float32).min  # HF's mask value: a kernel working in log2 units overflows it to -inf
for name, value, unresolved in [("bias_inf", -np.inf, False), ("bias_1e9", -1e9, True), ("bias_min", lowest, True)]:
    bias = np.where(hidden, value, f32(4, 48, 48)).astype(np.float32)
    bias[2, 5, :] = -np.inf  # a row the bias hides whole: o = 0, lse = -inf
    if unresolved:
        bias[1, 9, :] = value
    with h5py.File(name + ".h5", "w") as f:
        f["q"], f["k"], f["v"], f["do"], f["bias"] = q, k, v, do, bias
with h5py.File("float_mask.h5", "w") as f:
    f["q"], f["k"], f["v"] = q, k, v
    f["mask"] = np.where(np.tril(np.ones((48, 48), bool)), 0.0, -np.inf).astype(np.float32)
PY
check minus-inf-bias-taken 0 "ringattn run: ring" -- mpi 2 "$ra" run --input bias_inf.h5 --output bias_inf_out.h5 --backward
check minus-inf-bias-verified 0 "dbias vs f64 reference: .*#wrong 0  OK" -- mpi 2 "$ra" verify --input bias_inf.h5 \
  --output bias_inf_out.h5
check minus-inf-bias-tight 0 "tolerance [0-9.]*e-0[45]), lse" -- "$ra" verify --input bias_inf.h5 --output bias_inf_out.h5
check large-bias-run 0 "ringattn run: ring" -- mpi 3 "$ra" run --input bias_1e9.h5 --output bias_1e9_out.h5 --backward
check large-bias-unresolved-rows-named 0 "1 query rows have logits of about 1e+09" -- mpi 3 "$ra" verify \
  --input bias_1e9.h5 --output bias_1e9_out.h5
if $python -c "
import h5py
for n in ('bias_inf', 'bias_1e9'):
    with h5py.File(n + '_out.h5') as g, h5py.File(n + '_foreign.h5', 'w') as h:
        h['o'], h['lse'] = g['o'][...], g['lse'][...]
        h['o'][0, 20, 3, 4] += 0.01  # a row that sees keys: 0.01 is 100 of its tolerances
"; then
  check minus-inf-bias-wrong-found 1 "#wrong 1  FAILED" -- "$ra" verify --input bias_inf.h5 --output bias_inf_foreign.h5
  check large-bias-wrong-found 1 "#wrong 1  FAILED" -- mpi 2 "$ra" verify --input bias_1e9.h5 --output bias_1e9_foreign.h5
  # What a GPU writes for the row finfo.min hides whole (o = 0, lse = -inf; the CPU's f32 gives V's mean): allowed.
  check lowest-bias-run 0 "ringattn run: ring" -- "$ra" run --input bias_min.h5 --output bias_min_out.h5
  $python -c "
import h5py, numpy as np
with h5py.File('bias_min_out.h5') as g, h5py.File('bias_min_gpu.h5', 'w') as h:
    o, lse = g['o'][...], g['lse'][...]
    o[0, 9, 1, :], lse[0, 1, 9] = 0.0, -np.inf
    h['o'], h['lse'] = o, lse
"
  check lowest-bias-row-as-no-key 0 "1 query rows have logits of about 3.4e+38" -- "$ra" verify --input bias_min.h5 \
    --output bias_min_gpu.h5
else fails=$((fails+1)); echo "FAIL could not change the bias outputs"; fi
check float-mask-hinted 2 "a float mask that is added to the logits, .* is a bias: --bias-dataset names it" -r 2 -- mpi 2 \
  "$ra" run --input float_mask.h5 --output x.h5
check float-mask-as-bias 0 "ringattn run: ring" -- "$ra" run --input float_mask.h5 --output float_mask_out.h5 --bias-dataset mask
check float-mask-as-bias-verified 0 "#wrong 0  OK" -- "$ra" verify --input float_mask.h5 --output float_mask_out.h5 \
  --bias-dataset mask
check float-mask-both-roles 2 "\-\-mask-dataset and --bias-dataset both name dataset 'mask'" -r 2 -- mpi 2 "$ra" run \
  --input float_mask.h5 --output x.h5 --bias-dataset mask --mask-dataset mask
# 18. Other tensor formats (--qkv-format, TransformerEngine's names): PyTorch's bhsd, Megatron's sbhd, FlashAttention's
# varlen thd. Each gives the same bits as the same values in bshd, its outputs written in its format; a file in
# another format than the one given is named so.
$python - <<'PY'
import h5py, numpy as np
r = np.random.default_rng(13)
q, k, v, do = (r.standard_normal(s).astype(np.float32) for s in ((2, 45, 4, 16), (2, 31, 2, 16), (2, 31, 2, 8), (2, 45, 4, 8)))
bias = r.standard_normal((1, 4, 45, 31)).astype(np.float32)
formats = {"bshd": lambda x: x, "bhsd": lambda x: x.transpose(0, 2, 1, 3), "sbhd": lambda x: x.transpose(1, 0, 2, 3)}
for name, t in formats.items():
    with h5py.File(name + ".h5", "w") as f:
        f["q"], f["k"], f["v"], f["do"], f["bias"] = t(q), t(k), t(v), t(do), bias
with h5py.File("thd.h5", "w") as f:  # batch row 1 as packed tokens with FlashAttention's cu_seqlens
    f["q"], f["k"], f["v"], f["do"], f["cu_seqlens"] = q[1, :31], k[1], v[1], do[1, :31], np.array([0, 12, 31])
with h5py.File("bshd_1.h5", "w") as f:
    f["q"], f["k"], f["v"], f["do"], f["cu_seqlens"] = q[1:, :31], k[1:], v[1:], do[1:, :31], np.array([0, 12, 31])
with h5py.File("bhsd_do_bshd.h5", "w") as f:
    f["q"], f["k"], f["v"], f["do"] = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), do
with h5py.File("sbhd_1.h5", "w") as f:  # Megatron's batch of one, T != S: read as bshd, batch rows that disagree
    f["q"], f["k"], f["v"] = q[:1].transpose(1, 0, 2, 3), k[:1].transpose(1, 0, 2, 3), v[:1].transpose(1, 0, 2, 3)
with h5py.File("long_bhsd.h5", "w") as f:  # 300 tokens of 4 heads: read as bshd, 300 heads of 4 tokens
    f["q"] = f["k"] = f["v"] = r.standard_normal((1, 4, 300, 16)).astype(np.float32)
PY
for format in bshd bhsd sbhd; do
  check $format-run 0 "ringattn run: ring" -- mpi 3 "$ra" run --input $format.h5 --output ${format}_out.h5 \
    --qkv-format $format --causal --backward
done
check thd-run 0 "ringattn run: ring" -- mpi 3 "$ra" run --input thd.h5 --output thd_out.h5 --qkv-format thd --causal --backward
mpi 3 "$ra" run --input bshd_1.h5 --output bshd_1_out.h5 --causal --backward --quiet >/dev/null 2>&1
check formats-same-bits 0 "same" -- $python -c "
import h5py, numpy as np
a = h5py.File('bshd_out.h5')
for name, back in (('bhsd', (0, 2, 1, 3)), ('sbhd', (1, 0, 2, 3))):
    b = h5py.File(name + '_out.h5')
    for n in ('o', 'dq', 'dk', 'dv'): assert np.array_equal(a[n][...], b[n][...].transpose(back)), (name, n)
    for n in ('lse', 'dbias'): assert np.array_equal(a[n][...], b[n][...]), (name, n)
a, b = h5py.File('bshd_1_out.h5'), h5py.File('thd_out.h5')
for n in ('o', 'dq', 'dk', 'dv'): assert b[n].ndim == 3 and np.array_equal(a[n][0], b[n][...]), ('thd', n)
assert np.array_equal(a['lse'][...], b['lse'][...])
print('same')"
check bhsd-verified 0 "dv vs f64 reference: .*#wrong 0  OK" -- mpi 2 "$ra" verify --input bhsd.h5 --output bhsd_out.h5 \
  --qkv-format bhsd --causal
check sbhd-verified 0 "dbias vs f64 reference: .*#wrong 0  OK" -- mpi 2 "$ra" verify --input sbhd.h5 --output sbhd_out.h5 \
  --qkv-format sbhd --causal
check thd-verified 0 "dv vs f64 reference: .*#wrong 0  OK" -- "$ra" verify --input thd.h5 --output thd_out.h5 \
  --qkv-format thd --causal
check format-verify-other 2 "was written by run from --qkv-format bhsd files but verify reads bshd" -r 2 -- mpi 2 "$ra" \
  verify --input bshd.h5 --output bhsd_out.h5 --causal
check format-foreign-output-named 2 "the shape of bhsd (batch, heads, len, dim): --qkv-format bhsd reads the files so" -- \
  $python -c "
import h5py, subprocess, sys
with h5py.File('bhsd_out.h5') as g, h5py.File('bhsd_foreign.h5', 'w') as h:
    h['o'] = g['o'][...]  # another library's o, in PyTorch's order
sys.exit(subprocess.run(['$ra', 'verify', '--input', 'bshd.h5', '--output', 'bhsd_foreign.h5', '--causal']).returncode)"
check format-do-other 2 "dataset 'do' of 'bhsd_do_bshd.h5' has shape (2, 45, 4, 8), expected (2, 4, 45, 8) (batch, q_heads, q_len, v_head_dim) (the shape of bshd" -r 2 -- mpi 2 \
  "$ra" run --input bhsd_do_bshd.h5 --output x.h5 --qkv-format bhsd --backward
check thd-file-as-bshd 2 "has rank 3 (shape (31, 4, 16)), expected 4 .*read with --qkv-format thd" -r 2 -- mpi 2 "$ra" run \
  --input thd.h5 --output x.h5
check bshd-file-as-thd 2 "has rank 4 (shape (2, 45, 4, 16)), expected 3 (q_len, q_heads, head_dim)" -- "$ra" run \
  --input bshd.h5 --output x.h5 --qkv-format thd
check sbhd-file-as-bshd 2 "dataset 'k' of 'sbhd_1.h5' dimension 0 (batch) is 31, expected 45 (q's batch) (q, k and v agree as sbhd (len, batch, heads, dim): --qkv-format sbhd?)" -r 2 -- \
  mpi 2 "$ra" run --input sbhd_1.h5 --output x.h5
check bhsd-file-as-bshd 2 "q_heads) is 45, expected a multiple of k's kv_heads = 31 (q, k and v agree as bhsd" -- "$ra" run \
  --input bhsd.h5 --output x.h5
check format-unknown 2 "\-\-qkv-format 'bthd' is none of bshd" -- "$ra" run --input bshd.h5 --output x.h5 --qkv-format bthd
check bhsd-likely-noted 0 "has 300 heads and 4 tokens: if it holds (batch, heads, len, dim).* pass --qkv-format bhsd" -- \
  "$ra" run --input long_bhsd.h5 --output long_bhsd_out.h5
if "$ra" run --input long_bhsd.h5 --output long_bhsd_out2.h5 --qkv-format bhsd 2>&1 | grep -q "note: 'q'"; then
  fails=$((fails+1)); echo "FAIL bhsd-no-note-with-format"; else passes=$((passes+1)); echo "ok   bhsd-no-note-with-format"; fi
for format in bshd bhsd sbhd; do
  "$ra" generate --output gen_$format.h5 --batch 2 --seq 9 --kv-seq 7 --heads 4 --kv-heads 2 --head-dim 8 --with-grad \
    --seed 5 --qkv-format $format >/dev/null
done
check generate-formats-same-values 0 "same" -- $python -c "
import h5py, numpy as np
a = h5py.File('gen_bshd.h5')
for name, back in (('bhsd', (0, 2, 1, 3)), ('sbhd', (1, 0, 2, 3))):
    b = h5py.File('gen_' + name + '.h5')
    for n in ('q', 'k', 'v', 'do'): assert np.array_equal(a[n][...], b[n][...].transpose(back)), (name, n)
print('same')"
check generate-thd-one-row 2 "\-\-qkv-format thd holds one batch row (--batch is 2)" -- "$ra" generate --output x.h5 \
  --batch 2 --seq 9 --heads 4 --head-dim 8 --qkv-format thd
no_output nothing-left-behind x.h5
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
