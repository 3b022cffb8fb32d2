// Messages from a corrupt or hostile peer, as loco receives them. The first byte chooses:
//  0: an encoded outer gradient, decoded by each codec;
//  1: the chunks of a ring all-reduce (wrong sizes, too few messages);
//  2: a link-model frame (its arrival-time header);
//  3: a pipeline boundary (activations and token ids) into the last stage of a small model;
//  4: gradient-norm partial sums.
#include <cstring>
#include <thread>

#include "run/run.h"
#include "comm/codec.h"
#include "comm/communicator.h"
#include "comm/inprocess.h"
#include "comm/link.h"
#include "fuzz_common.h"
#include "pipeline/stage_model.h"

namespace {

const char* kCodecs[] = {"fp32", "bf16", "fp8", "fp4-e3m0", "fp4-e2m1", "int8", "random-drop", "topk"};

void codecs(const std::string& in) {
  if (in.size() < 2) return;
  const int64_t n = 1 + (uint8_t(in[0]) | (uint8_t(in[1]) << 8)) % 4096;
  const std::string payload = in.substr(2);
  for (const char* name : kCodecs) {
    std::vector<float> sum(size_t(n), 0.0f);
    try {
      loco::make_codec({name, "nearest", 32, 0.1})->decode_add(payload, sum.data(), n);
    } catch (const loco::Error&) {
    }
  }
}

void all_reduce(const std::string& in) {
  if (in.size() < 3) return;
  const int64_t n = 1 + uint8_t(in[0]) * 7;
  const std::string payload = in.substr(2);
  const size_t cut = std::min(payload.size(), size_t(uint8_t(in[1])) * 4);
  auto ts = loco::make_inprocess_transports(2);
  ts[1]->send(0, loco::kDataChannel, payload.substr(0, cut));
  ts[1]->send(0, loco::kDataChannel, payload.substr(cut));
  loco::Communicator comm(std::move(ts[0]), {0.01, 1}, nullptr, loco::kDataChannel);
  std::vector<float> data(size_t(n), 1.0f);
  comm.all_reduce(data.data(), n, loco::ReduceOp::Sum);
}

void link_frame(const std::string& in) {
  auto ts = loco::make_inprocess_transports(2);
  auto clock = std::make_shared<loco::VirtualClock>();
  auto receiver = loco::wrap_with_link(std::move(ts[0]), {1e9, 0.001}, clock);
  ts[1]->send(0, 0, in);
  receiver->recv(1, 0, 0.01);
}

void boundary(const std::string& in) {
  const loco::Transformer model(fuzz_model(2), {1, 2, false, true});
  std::vector<float> params(size_t(model.layout().size()), 0.01f), grads(params.size());
  loco::TransformerStage stage(model, 1, 4, 1, 1);
  stage.begin_step(1, params.data(), grads.data(), nullptr, nullptr, nullptr);
  const size_t split = std::min(in.size(), size_t(32) * 4);
  loco::BoundaryMessage msg, out;
  msg.activations.resize(split / 4);
  if (!msg.activations.empty()) std::memcpy(msg.activations.data(), in.data(), msg.activations.size() * 4);
  msg.tokens.resize((in.size() - split) / 4);
  if (!msg.tokens.empty()) std::memcpy(msg.tokens.data(), in.data() + split, msg.tokens.size() * 4);
  stage.forward(0, msg, out);
  std::vector<float> none, grad_in;
  stage.backward(0, none, grad_in);
}

void norm(const std::string& in) {
  const size_t cut = in.empty() ? 0 : uint8_t(in[0]) % (in.size() + 1);
  loco::combine_square_sums({in.substr(0, cut), in.substr(cut)}, 12);
}

}  // namespace

LOCO_FUZZ_TARGET({
  if (input.empty()) return 0;
  const std::string rest = input.substr(1);
  switch (uint8_t(input[0]) % 5) {
    case 0: codecs(rest); break;
    case 1: all_reduce(rest); break;
    case 2: link_frame(rest); break;
    case 3: boundary(rest); break;
    default: norm(rest); break;
  }
})
