#!/usr/bin/env bash
# Build ExecuTorch's Qualcomm LLM runner (qnn_llama_runner) for x86-64 Linux against the installed
# executorch==1.5.1 wheel, to run a bundle's `--executorch-program` host twin on the HTP simulator.
#
#   ./build.sh SRC            SRC: an ExecuTorch source checkout (the runner's sources are not in the wheel)
#   ./build.sh GIT_DIR REF    or a (bare) ExecuTorch git repository and a ref (a 1.5 commit, e.g. main of 2026-08)
#
# Runtime: the wheel's lib/ (libexecutorch.so holds extension_module, data_loader, tensor; the QNN backend
# and kernels register when loaded). Tokenizers: the wheel ships no tokenizers library to link, only the
# Python extension extension/llm/runner/_llm_runner*.so, which exports load_tokenizer() and the tokenizers
# code (it needs libpython3.11.so loaded; no Python code runs); headers from the pytorch_tokenizers wheel.
# gflags: shim/ (no gflags headers on this machine). patches/: four #includes runner.cpp never uses
# (they need re2 and nlohmann-json headers, absent here). Output: out/qnn_llama_runner.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-/tmp/qnn_llama_runner_x86}
SP=${SITE_PACKAGES:-$(cd "$HERE/../../.." && .venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}
ET=$SP/executorch
PYLIBDIR=${PYLIBDIR:-/usr/lib/x86_64-linux-gnu}
FILES="examples/qualcomm/oss_scripts/llama/qnn_llama_runner.cpp examples/qualcomm/oss_scripts/llama/runner
       extension/llm/runner extension/llm/sampler backends/qualcomm/runtime/QnnExecuTorch.h"
rm -rf "$W/src" && mkdir -p "$W/src/executorch" "$W/obj" "$W/out"
if [ $# -ge 2 ]; then                        # a git repository and a ref
  for d in $FILES; do
    for f in $(git -C "$1" ls-tree -r --name-only "$2" -- "$d"); do
      mkdir -p "$W/src/executorch/$(dirname "$f")"; git -C "$1" show "$2:$f" > "$W/src/executorch/$f"
    done
  done
else                                         # a checkout
  for d in $FILES; do mkdir -p "$W/src/executorch/$(dirname "$d")"; cp -r "$1/$d" "$W/src/executorch/$d"; done
fi
(cd "$W/src/executorch" && for p in "$HERE"/patches/*.patch; do patch -p1 -s < "$p"; done)
DEFS="-DC10_USING_CUSTOM_GENERATED_MACROS -DET_EVENT_TRACER_ENABLED -DET_USE_THREADPOOL"
INCS="-I$ET/include -I$ET/include/executorch/runtime/core/portable_type/c10 -I$W/src -I$SP/pytorch_tokenizers/include -I$HERE/shim"
R=$W/src/executorch/examples/qualcomm/oss_scripts/llama
OBJS=""
for s in $R/qnn_llama_runner.cpp $R/runner/{runner,decoder_runner,prompt_processor,token_generator,lhd_token_generator,attention_sink_rope_runner,rpc_mem,kv_manager}.cpp \
         $W/src/executorch/extension/llm/sampler/sampler.cpp $HERE/shim/gflags_shim.cpp; do
  o=$W/obj/$(basename "${s%.cpp}").o
  echo "CXX $(basename "$s")"; nice -n 19 g++ -std=c++17 -O2 -fPIC -Wno-deprecated-declarations $DEFS $INCS -c "$s" -o "$o"
  OBJS="$OBJS $o"
done
LLM=$ET/extension/llm/runner
g++ -o "$W/out/qnn_llama_runner" $OBJS -L"$ET/lib" -L"$LLM" -L"$PYLIBDIR" \
  -Wl,--no-as-needed -lexecutorch_backend_qnn -lexecutorch_kernels_optimized -lexecutorch_kernels_quantized \
  -Wl,--as-needed -lexecutorch -lexecutorch_threadpool -l:_llm_runner.cpython-311-x86_64-linux-gnu.so -lpython3.11 \
  -Wl,-rpath-link,"$ET/lib:$ET/extension/pybindings:$SP/torch/lib" \
  -Wl,-rpath,"$ET/lib:$LLM:$ET/extension/pybindings:$SP/torch/lib" -lpthread -ldl
echo "built $W/out/qnn_llama_runner"
