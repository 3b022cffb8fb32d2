#pragma once
// Precision of the matrix products (train.precision): fp32 through OpenBLAS or oneDNN
// (train.matmul_library), or bf16 operands with fp32 accumulation through oneDNN on CPUs with bf16
// instructions (AVX512-BF16, AMX-BF16). Everything else (master weights, optimizer state, norms,
// softmax, losses, reductions) stays fp32.
#include <string>

namespace loco {

enum class Precision { fp32, bf16 };

// The products' precision for every thread of the process (default fp32).
void set_matmul_precision(Precision p);
Precision matmul_precision();
inline const char* precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

// The library of the model's fp32 products, for every thread of the process (default OpenBLAS).
enum class Fp32Library { openblas, onednn };
void set_fp32_library(Fp32Library l);
Fp32Library fp32_library();
inline const char* library_name(Fp32Library l) { return l == Fp32Library::onednn ? "oneDNN" : "OpenBLAS"; }

struct CpuFeatures {
  bool avx512 = false, avx512_bf16 = false, amx_bf16 = false;
  std::string model;  // /proc/cpuinfo's model name
};
const CpuFeatures& cpu_features();
// Whether bf16 products run natively here (AVX512-BF16 or AMX-BF16).
inline bool cpu_runs_bf16() { return cpu_features().avx512_bf16 || cpu_features().amx_bf16; }
// e.g. "AMD EPYC (AVX-512, AVX512-BF16)".
std::string describe_cpu();

// Resolves train.matmul_library ("auto", "openblas", "onednn") on this CPU: auto is oneDNN where
// the CPU has AVX-512 (there its fp32 products measured faster: 1.0-2.5x OpenBLAS on Intel Xeons,
// 1.37x on the parity study's shapes on an AMD EPYC), else OpenBLAS. By ISA, not by a timing, so
// that a run resumed on the same machine computes the same bits.
Fp32Library resolve_fp32_library(const std::string& wanted);

// Resolves train.precision ("fp32", "bf16", "auto") on this CPU; `note` gets the line to print
// at start, naming `library` for fp32. bf16 asked for on a CPU without bf16 instructions runs
// fp32 and says so.
Precision resolve_precision(const std::string& wanted, Fp32Library library, std::string* note);

}  // namespace loco
