#include "core/precision.h"

#include <cpuid.h>

#include <atomic>
#include <fstream>

#include "core/error.h"

namespace loco {

namespace {
std::atomic<Precision> g_precision{Precision::fp32};
std::atomic<Fp32Library> g_library{Fp32Library::openblas};
}

void set_matmul_precision(Precision p) { g_precision.store(p); }
Precision matmul_precision() { return g_precision.load(); }
void set_fp32_library(Fp32Library l) { g_library.store(l); }
Fp32Library fp32_library() { return g_library.load(); }

Fp32Library resolve_fp32_library(const std::string& wanted) {
  if (wanted == "openblas") return Fp32Library::openblas;
  if (wanted == "onednn") return Fp32Library::onednn;
  if (wanted != "auto") fail("train.matmul_library must be auto, openblas or onednn, got " + wanted);
  return cpu_features().avx512 ? Fp32Library::onednn : Fp32Library::openblas;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    unsigned a, b, cx, d;
    if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
      c.avx512 = (b >> 16) & 1;    // AVX512F
      c.amx_bf16 = (d >> 22) & 1;  // AMX-BF16
    }
    if (__get_cpuid_count(7, 1, &a, &b, &cx, &d)) c.avx512_bf16 = (a >> 5) & 1;
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("model name", 0) == 0) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) c.model = line.substr(line.find_first_not_of(" \t", colon + 1));
        break;
      }
    if (c.model.empty()) c.model = "unknown CPU";
    return c;
  }();
  return f;
}

std::string describe_cpu() {
  const auto& f = cpu_features();
  std::string isa;
  auto add = [&](bool has, const char* name) {
    if (has) isa += (isa.empty() ? "" : ", ") + std::string(name);
  };
  add(f.avx512, "AVX-512");
  add(f.avx512_bf16, "AVX512-BF16");
  add(f.amx_bf16, "AMX-BF16");
  return f.model + " (" + (isa.empty() ? "no AVX-512" : isa) + ")";
}

Precision resolve_precision(const std::string& wanted, Fp32Library library, std::string* note) {
  const bool native = cpu_runs_bf16();
  const std::string fp32_products = std::string("products through ") + library_name(library);
  if (wanted == "fp32") {
    *note = "precision fp32: " + fp32_products + " on " + describe_cpu();
    return Precision::fp32;
  }
  if (wanted != "bf16" && wanted != "auto") fail("train.precision must be fp32, bf16 or auto, got " + wanted);
  if (native) {
    *note = std::string("precision bf16 (") + (wanted == "auto" ? "auto, " : "") +
            "products with bf16 operands and fp32 accumulation through oneDNN on " + describe_cpu() + ")";
    return Precision::bf16;
  }
  *note = wanted == "auto" ? "precision fp32 (auto: " + describe_cpu() + " has no bf16 instructions): " + fp32_products
                           : "precision fp32: bf16 was asked for, but " + describe_cpu() +
                                 " has no bf16 instructions (AVX512-BF16 or AMX-BF16), where it would be slower "
                                 "than fp32; " + fp32_products;
  return Precision::fp32;
}

}  // namespace loco
