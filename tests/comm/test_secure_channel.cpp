// The elastic data plane's cryptography (elastic/secure_channel.h): what opens is exactly what
// the rightful sender sealed, in its order, on its connection, in its run and attempt.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "elastic/secure_channel.h"

namespace loco {
namespace {

const std::string kSecret = "a secret of thirty-two bytes ...";

const uint8_t* bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// Opens every frame of `stream`; throws at the first that fails; returns the payloads.
std::vector<std::string> open_all(const std::string& stream, const Key& key) {
  FrameOpener opener(key, 4);
  std::vector<std::string> out;
  size_t at = 0;
  while (at < stream.size()) {
    if (stream.size() - at < kFrameHeaderBytes) fail("a truncated header");
    const uint8_t* h = bytes(stream) + at;
    const FrameHeader fh = opener.header(h);
    if (stream.size() - at < kFrameHeaderBytes + fh.length + kFrameTagBytes) fail("a truncated frame");
    std::string m(fh.length, '\0');
    opener.open(h, fh, h + kFrameHeaderBytes, reinterpret_cast<uint8_t*>(m.data()));
    out.push_back(m);
    at += kFrameHeaderBytes + fh.length + kFrameTagBytes;
  }
  return out;
}

struct Handshake {
  Key kt;
  Nonce nc = random_nonce(), ns = random_nonce();
  explicit Handshake(const std::string& id = "4:1") : kt(derive_transport_key(derive_run_key(kSecret, "run"), id)) {}
};

TEST(SecureChannel, KeysDependOnSecretRunAndTransport) {
  const Key a = derive_run_key(kSecret, "run");
  EXPECT_EQ(a, derive_run_key(kSecret, "run"));
  EXPECT_NE(a, derive_run_key(kSecret, "other-run"));
  EXPECT_NE(a, derive_run_key(kSecret + "!", "run"));
  EXPECT_NE(derive_transport_key(a, "4:1"), derive_transport_key(a, "4:2"));
  EXPECT_THROW(derive_run_key("fifteen bytes..", "run"), Error);
}

TEST(SecureChannel, HandshakeAcceptsOnlyTheKeyHolderAndItsDestination) {
  Handshake h;
  const std::string hello = make_hello(h.kt, 3, 1, h.nc);
  ASSERT_EQ(hello.size(), kHelloBytes);
  uint32_t from = 0;
  Nonce nc;
  ASSERT_TRUE(open_hello(h.kt, bytes(hello), 1, &from, &nc));
  EXPECT_EQ(from, 3u);
  EXPECT_EQ(nc, h.nc);
  EXPECT_FALSE(open_hello(h.kt, bytes(hello), 2, &from, &nc));                   // another listener
  EXPECT_FALSE(open_hello(Handshake("4:2").kt, bytes(hello), 1, &from, &nc));   // another attempt
  for (size_t i = 0; i < hello.size(); ++i) {                                    // any byte altered
    std::string bad = hello;
    bad[i] = char(bad[i] ^ 0x40);
    EXPECT_FALSE(open_hello(h.kt, bytes(bad), 1, &from, &nc)) << "byte " << i;
  }
  // A lower rank never connects to a higher one.
  EXPECT_FALSE(open_hello(h.kt, bytes(make_hello(h.kt, 1, 3, h.nc)), 3, &from, &nc));

  const std::string welcome = make_welcome(h.kt, 3, 1, h.nc, h.ns);
  Nonce ns;
  ASSERT_TRUE(open_welcome(h.kt, bytes(welcome), 3, 1, h.nc, &ns));
  EXPECT_EQ(ns, h.ns);
  EXPECT_FALSE(open_welcome(h.kt, bytes(welcome), 3, 1, random_nonce(), &ns));  // not for this HELLO
  EXPECT_FALSE(open_welcome(h.kt, bytes(welcome), 2, 1, h.nc, &ns));

  const std::string confirm = make_confirm(h.kt, 3, 1, h.nc, h.ns);
  EXPECT_TRUE(confirm_ok(h.kt, bytes(confirm), 3, 1, h.nc, h.ns));
  // A replayed HELLO meets a fresh nonce_s: the old CONFIRM does not answer it.
  EXPECT_FALSE(confirm_ok(h.kt, bytes(confirm), 3, 1, h.nc, random_nonce()));
}

TEST(SecureChannel, FramesOpenInOrderAndNothingElseOpens) {
  Handshake h;
  const Key k31 = direction_key(h.kt, 3, 1, h.nc, h.ns), k13 = direction_key(h.kt, 1, 3, h.nc, h.ns);
  EXPECT_NE(k31, k13);
  FrameSealer sealer(k31);
  std::string stream, first;
  sealer.seal(1, false, "hello ", 6, stream);
  first = stream;
  sealer.seal(1, true, "world", 5, stream);
  sealer.seal(3, true, "", 0, stream);
  EXPECT_EQ(open_all(stream, k31), (std::vector<std::string>{"hello ", "world", ""}));
  // The plaintext does not appear on the wire.
  EXPECT_EQ(stream.find("hello"), std::string::npos);
  // Every single altered byte, anywhere, stops the stream.
  for (size_t i = 0; i < stream.size(); ++i) {
    std::string bad = stream;
    bad[i] = char(bad[i] ^ 1);
    EXPECT_THROW(open_all(bad, k31), Error) << "byte " << i;
  }
  // Replayed, reordered, reflected or moved to another connection: refused.
  EXPECT_THROW(open_all(first + first, k31), Error);
  EXPECT_THROW(open_all(stream.substr(first.size()) + first, k31), Error);
  EXPECT_THROW(open_all(stream, k13), Error);
  EXPECT_THROW(open_all(stream, direction_key(h.kt, 3, 1, h.nc, random_nonce())), Error);
}

TEST(SecureChannel, HeadersAreCheckedBeforeAnyBodyIsRead) {
  FrameOpener opener(Key{}, 4);
  auto header = [](uint32_t channel, uint32_t length, uint32_t flags) {
    std::vector<uint8_t> h(kFrameHeaderBytes);
    std::memcpy(h.data(), &channel, 4);
    std::memcpy(h.data() + 4, &length, 4);
    std::memcpy(h.data() + 8, &flags, 4);
    return h;
  };
  EXPECT_NO_THROW(opener.header(header(3, uint32_t(kMaxFrame), kFrameLast).data()));
  EXPECT_THROW(opener.header(header(4, 8, 0).data()), Error);
  EXPECT_THROW(opener.header(header(0, uint32_t(kMaxFrame) + 1, 0).data()), Error);
  EXPECT_THROW(opener.header(header(0, 0xffffffffu, 0).data()), Error);
  EXPECT_THROW(opener.header(header(0, 8, 2).data()), Error);
}

TEST(SecureChannel, RedisEntriesCarryAMac) {
  const Key k = derive_run_key(kSecret, "run");
  const std::string mac = mac_entry(k, "loco:run:net:4:1:addr:0", "10.0.0.1 4000");
  EXPECT_TRUE(entry_mac_ok(k, "loco:run:net:4:1:addr:0", "10.0.0.1 4000", mac));
  EXPECT_FALSE(entry_mac_ok(k, "loco:run:net:4:1:addr:0", "10.0.0.9 4000", mac));   // redirected
  EXPECT_FALSE(entry_mac_ok(k, "loco:run:net:4:1:addr:1", "10.0.0.1 4000", mac));   // moved
  EXPECT_FALSE(entry_mac_ok(derive_run_key(kSecret, "run2"), "loco:run:net:4:1:addr:0", "10.0.0.1 4000", mac));
  EXPECT_FALSE(entry_mac_ok(k, "loco:run:net:4:1:addr:0", "10.0.0.1 4000", mac.substr(1)));
}

}  // namespace
}  // namespace loco
