// What a stranger or a bad member can send to the elastic data plane (elastic/secure_channel.h).
// The first byte chooses:
//  0: bytes to a listener: a HELLO, then a CONFIRM;
//  1: bytes to a connecting member: a WELCOME;
//  2: a raw stream of frames on an established connection;
//  3: frames sealed by the rightful sender, with one byte of the stream altered: opening the
//     altered stream must fail at or before the altered frame (a frame that opens although a
//     byte of it changed is a finding, reported by abort()).
#include <cstdlib>
#include <cstring>
#include <vector>

#include "elastic/secure_channel.h"
#include "fuzz_common.h"

namespace {

const loco::Key& transport_key() {
  static const loco::Key k =
      loco::derive_transport_key(loco::derive_run_key("fuzzing secret, 32 bytes long..", "fuzz"), "1:0");
  return k;
}

void handshake(const std::string& in) {
  const auto& kt = transport_key();
  if (in.size() < loco::kHelloBytes) return;
  uint32_t from = 0;
  loco::Nonce nc{}, ns{};
  if (!loco::open_hello(kt, reinterpret_cast<const uint8_t*>(in.data()), 0, &from, &nc)) return;
  if (in.size() < loco::kHelloBytes + loco::kConfirmBytes) return;
  loco::confirm_ok(kt, reinterpret_cast<const uint8_t*>(in.data()) + loco::kHelloBytes, from, 0, nc, ns);
}

void welcome(const std::string& in) {
  if (in.size() < loco::kWelcomeBytes) return;
  loco::Nonce nc{}, ns{};
  loco::open_welcome(transport_key(), reinterpret_cast<const uint8_t*>(in.data()), 1, 0, nc, &ns);
}

// Opens frames from `stream` in order; returns how many opened (stops at the first failure).
size_t open_stream(const std::string& stream, const loco::Key& key) {
  loco::FrameOpener opener(key, 4);
  size_t at = 0, opened = 0;
  std::vector<uint8_t> out;
  try {
    while (stream.size() - at >= loco::kFrameHeaderBytes) {
      const auto* h = reinterpret_cast<const uint8_t*>(stream.data() + at);
      const loco::FrameHeader fh = opener.header(h);
      const size_t body = fh.length + loco::kFrameTagBytes;
      if (stream.size() - at - loco::kFrameHeaderBytes < body) break;
      out.resize(fh.length);
      opener.open(h, fh, h + loco::kFrameHeaderBytes, out.data());
      at += loco::kFrameHeaderBytes + body;
      ++opened;
    }
  } catch (const loco::Error&) {
  }
  return opened;
}

const loco::Key& direction() {
  static const loco::Key k = loco::direction_key(transport_key(), 1, 0, loco::Nonce{}, loco::Nonce{});
  return k;
}

void altered(const std::string& in) {
  if (in.size() < 4) return;
  // Records: channel (1 byte), length (1 byte), then that many bytes of payload.
  loco::FrameSealer sealer(direction());
  std::string stream;
  std::vector<size_t> ends;
  for (size_t at = 3; at + 2 <= in.size();) {
    const uint32_t channel = uint8_t(in[at]) % 4;
    const size_t n = std::min<size_t>(uint8_t(in[at + 1]), in.size() - at - 2);
    sealer.seal(channel, n % 2 == 0, in.data() + at + 2, n, stream);
    ends.push_back(stream.size());
    at += 2 + n;
  }
  if (stream.empty()) return;
  const size_t pos = (uint8_t(in[1]) | size_t(uint8_t(in[2])) << 8) % stream.size();
  const uint8_t flip = uint8_t(in[0]) | 1;  // never zero: the byte changes
  if (open_stream(stream, direction()) != ends.size()) std::abort();  // the unaltered stream opens whole
  stream[pos] = char(stream[pos] ^ flip);
  size_t frame = 0;
  while (ends[frame] <= pos) ++frame;  // the frame holding the altered byte
  if (open_stream(stream, direction()) > frame) std::abort();
}

}  // namespace

LOCO_FUZZ_TARGET({
  if (input.empty()) return 0;
  const std::string rest = input.substr(1);
  switch (uint8_t(input[0]) % 4) {
    case 0: handshake(rest); break;
    case 1: welcome(rest); break;
    case 2: open_stream(rest, direction()); break;
    default: altered(rest); break;
  }
})
