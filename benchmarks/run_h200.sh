#!/usr/bin/env bash
# On the H200 device machine: install the carried wheels, then run stages.
#   bash benchmarks/run_h200.sh STAGE...
# Stages (minutes, roughly):
#   tests (8: alone in one call) = tests-1 + tests-2 (4 each): the whole suite on the GPU
#   gpu-tests (2): the tests that exercise CUDA
#   prepare (0.5), attention (3), bench-1b (1), bench-8b (1.5): prepare_inputs,
#     attention against SDPA, decode against the floor; bench-small = prepare attention bench-1b
#   e2e (1.5), ipc (1), gemv (2)
#   tp (6), tp-decode (3): several GPUs (issue 8)
# Logs and JSON summaries go to $OUT (the device tool brings back 8 files at most).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TPRUN_CACHE=/tmp/tprun-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"

pytest_files() {  # $1 log name, then pytest arguments
  local log=$1; shift
  timeout 400 python3 -m pytest -q -p no:cacheprovider --durations=10 "$@" 2>&1 \
    | tee -a "$OUT/$log" | tail -25
}

tp_sizes() {  # 1 2 4 8, as many as the host has GPUs
  local gpus
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  for n in 1 2 4 8; do [ "$n" -le "$gpus" ] && echo -n "$n "; done
}

run_stage() {
  case "$1" in
    tests) run_stage tests-1; run_stage tests-2 ;;
    tests-1) pytest_files pytest_gpu.log $(ls tests/test_[a-l]*.py) ;;
    tests-2) pytest_files pytest_gpu.log $(ls tests/test_[m-z]*.py) ;;
    gpu-tests)
      pytest_files pytest_gpu_kernels.log tests/test_layer_kernels.py tests/test_model_parity.py \
        -k "cuda or Triton or triton or rms or rotary or silu"
      pytest_files pytest_gpu_kernels.log tests/test_gpu_graphs.py tests/test_gpu_no_sync.py \
        tests/test_sampler.py tests/test_input_kernels_padded_rows.py \
        tests/test_runner_graph_path.py tests/test_runner_slot_reuse.py tests/test_triton_attention.py \
        tests/test_skinny_matmul.py
      ;;
    prepare)
      timeout 60 python3 benchmarks/bench_prepare_inputs.py 2>&1 | tee "$OUT/prepare_inputs.log" ;;
    attention)
      timeout 200 python3 benchmarks/bench_attention.py --out "$OUT/attention.json" 2>&1 \
        | tail -60 | tee "$OUT/attention.log" ;;
    bench-small) run_stage prepare; run_stage attention; run_stage bench-1b ;;
    bench-1b)
      timeout 240 python3 benchmarks/bench_decode.py --shape 1b --batches 1 8 32 128 256 \
        --contexts 512 4096 --idle --out "$OUT/decode_1b.json" 2>&1 \
        | tee "$OUT/decode_1b.log" | tail -1 ;;
    bench-8b)
      timeout 280 python3 benchmarks/bench_decode.py --shape 8b --batches 1 8 32 64 128 256 \
        --contexts 512 4096 --idle --profile-host --kernel-table --out "$OUT/decode_8b.json" \
        > "$OUT/decode_8b.log" 2> "$OUT/decode_8b.err"
      tail -3 "$OUT/decode_8b.log" ;;
    e2e)
      timeout 280 python3 benchmarks/bench_e2e.py --shape 8b --out "$OUT/e2e_8b.json" 2>&1 \
        | grep -v "capturing CUDA" | tee "$OUT/e2e_8b.log" | tail -1 ;;
    ipc)
      timeout 240 python3 benchmarks/bench_ipc.py --out "$OUT/ipc.json" 2>&1 \
        | tee "$OUT/ipc.log" | tail -30 ;;
    gemv)
      timeout 280 python3 benchmarks/bench_gemv.py --rows 1 8 --out "$OUT/gemv.json" 2>&1 \
        | tee "$OUT/gemv.log" | tail -14 ;;
    tp)  # agreement with TP=1 and speed, async scheduling on and off
      timeout 560 python3 benchmarks/bench_tp.py --shape 8b --tp $(tp_sizes) --output-len 64 \
        --out "$OUT/tp_8b.json" 2>&1 | grep -v "capturing CUDA" | tee "$OUT/tp_8b.log" | tail -1 ;;
    tp-decode)  # the decode step per rank, NCCL all-reduce inside, with a kernel table
      for n in $(tp_sizes); do
        [ "$n" -gt 1 ] || continue
        timeout 180 python3 -m torch.distributed.run --nproc-per-node "$n" \
          benchmarks/bench_decode.py --shape 8b --batches 1 8 32 64 128 --contexts 512 4096 \
          --kernel-table --out "$OUT/decode_8b_tp$n.json" >> "$OUT/decode_8b_tp.log" 2>&1
        tail -1 "$OUT/decode_8b_tp.log" | cut -c1-300
      done ;;
    tp-tests)  # the custom all-reduce on two GPUs, against NCCL
      pytest_files pytest_gpu_tp.log tests/test_custom_all_reduce.py ;;
    allreduce)  # all-reduce alone, custom against NCCL, inside CUDA graphs
      timeout 150 python3 -m torch.distributed.run --nproc-per-node 2 \
        benchmarks/bench_allreduce.py --out "$OUT/allreduce_tp2.json" > "$OUT/allreduce.log" 2>&1
      tail -16 "$OUT/allreduce.log" | cut -c1-200 ;;
    tp-decode-ab)  # decode step of TP=1, TP=2 (custom all-reduce) and TP=2 (NCCL), one run
      local shape=${TP_SHAPE:-8b}
      timeout 200 python3 benchmarks/bench_decode.py --shape "$shape" --batches 1 8 32 64 128 \
        --contexts 512 4096 --out "$OUT/decode_${shape}_tp1.json" > "$OUT/tp_decode.log" 2>&1
      tail -1 "$OUT/tp_decode.log" | cut -c1-300
      for flag in "" --disable-custom-all-reduce; do
        timeout 200 python3 -m torch.distributed.run --nproc-per-node 2 \
          benchmarks/bench_decode.py --shape "$shape" --batches 1 8 32 64 128 --contexts 512 4096 \
          --kernel-table $flag --out "$OUT/decode_${shape}_tp2${flag:+_nccl}.json" >> "$OUT/tp_decode.log" 2>&1
        tail -1 "$OUT/tp_decode.log" | cut -c1-300
      done ;;
    *) echo "unknown stage $1" >&2; return 1 ;;
  esac
}

for stage in "${@:-tests}"; do
  run_stage "$stage"
done
