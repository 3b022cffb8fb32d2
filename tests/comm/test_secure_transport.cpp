// The elastic data plane over real sockets (elastic/secure_transport.h): members of a quorum
// find each other in an address book and talk only after the handshake; strangers who reach a
// listening port first (random bytes, a crafted header, a replayed HELLO, a silent connection)
// are dropped and hold no member's place; a member with another secret is refused by all.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "core/error.h"
#include "elastic/secure_transport.h"

namespace loco {
namespace {

const std::string kSecret = "thirty-two bytes of run secret..";

// An address book in memory. While `gated`, members cannot read each other's addresses (so a
// stranger who watches the book reaches the listeners first, deterministically).
class TestBook : public MemoryAddressBook {
 public:
  bool get(const std::string& key, std::string* value) override {
    if (!gated_ && key == forged_key_) {  // a forger that always wins the race to the entry
      *value = forged_value_;
      return true;
    }
    return !gated_ && MemoryAddressBook::get(key, value);
  }
  std::string forged_key_, forged_value_;
  // The stranger's view: waits for an entry whatever the gate.
  std::string wait_for(const std::string& key) {
    std::string v;
    while (!MemoryAddressBook::get(key, &v)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return v;
  }
  void open_gate() { gated_ = false; }
  std::atomic<bool> gated_{false};
};

// A connection to the listener of an address book entry ("HOST PORT MAC"); -1 if refused.
int try_connect(const std::string& entry) {
  const int port = std::stoi(entry.substr(entry.find(' ') + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  ::close(fd);
  return -1;
}

int connect_to(const std::string& entry) {
  const int fd = try_connect(entry);
  EXPECT_GE(fd, 0) << "the listener refused a connection";
  return fd;
}

// True if the other end closes `fd` within `seconds` (after any bytes it sent).
bool closed_by_peer(int fd, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(int(seconds * 1000));
  char buf[256];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
      if (r <= 0) return true;
    }
  }
  return false;
}

std::vector<std::unique_ptr<Transport>> form(TestBook& book, int n, const std::vector<std::string>& secrets,
                                             double timeout_s, std::vector<std::string>* errors = nullptr) {
  std::vector<std::future<std::unique_ptr<Transport>>> fs;
  for (int r = 0; r < n; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      SecureTransportOptions o;
      o.address = "127.0.0.1";
      o.timeout_s = timeout_s;
      return make_secure_transport(book, "t:", derive_run_key(secrets[size_t(r)], "run"), "7:0", r, n, o);
    }));
  std::vector<std::unique_ptr<Transport>> ts;
  for (auto& f : fs) {
    try {
      ts.push_back(f.get());
    } catch (const PeerError& e) {
      if (!errors) throw;
      errors->push_back(std::string(e.what()) + " [blamed " + std::to_string(e.peers().size()) + "]");
      ts.push_back(nullptr);
    } catch (const Error& e) {
      if (!errors) throw;
      errors->push_back(e.what());
      ts.push_back(nullptr);
    }
  }
  return ts;
}

// Every ordered pair exchanges a message on two channels, one of them longer than a frame.
void exchange_all(std::vector<std::unique_ptr<Transport>>& ts) {
  const int n = int(ts.size());
  const std::string big(3 * kMaxFrame + 17, 'x');
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) {
        ts[size_t(i)]->send(j, kDataChannel, big + std::to_string(i));
        ts[size_t(i)]->send(j, kControlChannel, "from " + std::to_string(i));
      }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) {
        EXPECT_EQ(ts[size_t(j)]->recv(i, kControlChannel, 10), "from " + std::to_string(i));
        EXPECT_EQ(ts[size_t(j)]->recv(i, kDataChannel, 10), big + std::to_string(i));
      }
}

TEST(SecureTransport, AQuorumFormsAndCarriesMessagesOnEveryChannel) {
  TestBook book;
  auto ts = form(book, 3, {kSecret, kSecret, kSecret}, 10);
  exchange_all(ts);
  // Nothing more arrives than was sent: the next recv times out with the peer named.
  try {
    ts[0]->recv(1, kDataChannel, 0.2);
    ADD_FAILURE() << "a message that was never sent arrived";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("member 1"), std::string::npos) << e.what();
  }
}

TEST(SecureTransport, StrangersAtTheListenersAreDroppedAndTheQuorumFormsRegardless) {
  TestBook book;
  book.gated_ = true;
  std::vector<int> strangers;
  std::thread stranger([&] {
    // Ranks 0 and 1 listen (for ranks above them). At each, before any member can connect:
    for (const char* key : {"t:addr:0", "t:addr:1"}) {
      const std::string entry = book.wait_for(key);
      int fd = connect_to(entry);  // random bytes
      std::string noise(200, '\0');
      for (size_t i = 0; i < noise.size(); ++i) noise[i] = char(i * 37 + 11);
      ::send(fd, noise.data(), noise.size(), MSG_NOSIGNAL);
      strangers.push_back(fd);
      fd = connect_to(entry);  // a 48-byte header, as crafted against the old transport
      ::send(fd, noise.data(), 48, MSG_NOSIGNAL);
      strangers.push_back(fd);
      fd = connect_to(entry);  // the right magic and a forged MAC
      std::string hello = "LOCOSEC1";
      hello.append("\x02\0\0\0\0\0\0\0", 8);
      hello.append(64, '\x5a');
      ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
      strangers.push_back(fd);
      // A HELLO recorded from a member (valid MAC), replayed: it earns a WELCOME it cannot confirm.
      const Key kt = derive_transport_key(derive_run_key(kSecret, "run"), "7:0");
      fd = connect_to(entry);
      const std::string replay = make_hello(kt, 2, uint32_t(key[7] - '0'), random_nonce());
      ::send(fd, replay.data(), replay.size(), MSG_NOSIGNAL);
      char welcome[kWelcomeBytes];
      EXPECT_EQ(::recv(fd, welcome, sizeof welcome, MSG_WAITALL), ssize_t(sizeof welcome));
      ::send(fd, noise.data(), kConfirmBytes, MSG_NOSIGNAL);
      strangers.push_back(fd);
      strangers.push_back(connect_to(entry));  // silent, held open
    }
    book.open_gate();
  });
  auto ts = form(book, 3, {kSecret, kSecret, kSecret}, 5);
  stranger.join();
  exchange_all(ts);
  ASSERT_EQ(strangers.size(), 10u);
  for (size_t i = 0; i < strangers.size(); ++i) {
    EXPECT_TRUE(closed_by_peer(strangers[i], 6)) << "stranger " << i << " was not dropped";
    ::close(strangers[i]);
  }
}

TEST(SecureTransport, AMemberWithAnotherSecretIsRefusedByAll) {
  TestBook book;
  std::vector<std::string> errors;
  auto ts = form(book, 3, {kSecret, kSecret, "another secret, just as long..."}, 1.5, &errors);
  ASSERT_EQ(ts[0], nullptr);  // rank 0 waits in vain for rank 2
  ASSERT_EQ(ts[2], nullptr);
  bool named = false, refused = false;
  for (const auto& e : errors) {
    named |= e.find("member(s) 2") != std::string::npos;  // rank 0 (and 1): rank 2 never authenticated
    refused |= e.find("another secret") != std::string::npos;  // rank 2: no address with its MAC
  }
  EXPECT_TRUE(named && refused) << errors.size() << " errors, first: " << (errors.empty() ? "" : errors[0]);
}

TEST(SecureTransport, AForgedAddressIsIgnoredAndItsOwnerWritesItsOwnAgain) {
  TestBook book;
  // Rank 0's entry rewritten once by someone without the secret, pointing elsewhere: rank 1
  // ignores it, rank 0 writes its own again, and the quorum forms.
  book.gated_ = true;
  std::thread forger([&] {
    const std::string entry = book.wait_for("t:addr:0");
    book.put("t:addr:0", "127.0.0.1 9 " + entry.substr(entry.rfind(' ') + 1));
    book.open_gate();
  });
  auto ts = form(book, 2, {kSecret, kSecret}, 5);
  forger.join();
  exchange_all(ts);
}

TEST(SecureTransport, AnAddressForgedAgainAndAgainFailsTheQuorumWithoutBlamingItsOwner) {
  // Every read of rank 0's entry finds the forger's (whatever rank 0 writes back): rank 1
  // never sees a genuine entry, gives up at the timeout and blames nobody, since anyone who can
  // write to the book can do this.
  TestBook book;
  book.forged_key_ = "t:addr:0";
  book.forged_value_ = "127.0.0.1 9 " + std::string(64, 'a');
  std::vector<std::string> errors;
  auto ts = form(book, 2, {kSecret, kSecret}, 1.5, &errors);
  ASSERT_EQ(ts[1], nullptr);
  bool unblamed = false;
  for (const auto& e : errors) unblamed |= e.find("(forged, or this worker holds another secret)") != std::string::npos && e.find("[blamed 0]") != std::string::npos;
  EXPECT_TRUE(unblamed) << errors.size() << " errors, first: " << (errors.empty() ? "" : errors[0]);
}

TEST(SecureTransport, HeldConnectionsDoNotStarveTheMembers) {
  // 200 silent connections held at each listener before any member may connect, and a new one
  // at each every 10 ms while the quorum forms: the oldest silent connection makes room for each
  // newcomer, so the members' connections (which send their HELLO at once) get through.
  TestBook book;
  book.gated_ = true;
  std::deque<int> held;
  std::atomic<bool> stop{false};
  std::thread stranger([&] {
    const std::string e0 = book.wait_for("t:addr:0"), e1 = book.wait_for("t:addr:1");
    for (int i = 0; i < 200; ++i) {
      held.push_back(connect_to(e0));
      held.push_back(connect_to(e1));
    }
    book.open_gate();
    // Until the quorum has formed (a listener closed once its members are in refuses
    // connections). Every connection the listeners let go is closed here too (so that only
    // those they hold stay open, and this process's descriptors last); the others stay held.
    while (!stop) {
      for (const auto* e : {&e0, &e1}) {
        const int fd = try_connect(*e);
        if (fd >= 0) held.push_back(fd);
      }
      std::deque<int> open;
      for (const int fd : held) {
        pollfd p{fd, POLLIN, 0};
        char c;
        if (::poll(&p, 1, 0) > 0 && ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0)
          ::close(fd);
        else
          open.push_back(fd);
      }
      held.swap(open);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::vector<std::string> errors;
  auto ts = form(book, 3, {kSecret, kSecret, kSecret}, 5, &errors);
  stop = true;
  stranger.join();
  for (int fd : held) ::close(fd);
  ASSERT_TRUE(errors.empty()) << errors[0];
  exchange_all(ts);
}

}  // namespace
}  // namespace loco
