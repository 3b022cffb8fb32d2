// loco's Python extension (_loco): the same communicators, codecs and training methods as
// `loco train`, around a model loco does not hold. Python (python/loco/torch.py) lays a torch
// model's parameters and gradients onto a Method's flat buffers (numpy views of them, no copy),
// and calls the method's hooks around its own optimizer step; every algorithm is the C++ one
// the native trainer runs (algo/algorithm.h), on a Worker built from a foreign ParamLayout.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "algo/algorithm.h"
#include "algo/noloco.h"
#include "algo/streaming.h"
#include "algo/worker.h"
#include "comm/codec.h"
#include "comm/communicator.h"
#include "comm/inprocess.h"
#include "comm/link.h"
#include "comm/mpi_transport.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/interrupt.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "elastic/fingerprint.h"
#include "elastic/methods.h"
#include "elastic/options.h"
#include "elastic/redis.h"
#include "io/config_schema.h"
#include "algo/run_config.h"
#include "io/train_state.h"
#include "pipeline/executor.h"

namespace py = pybind11;

namespace loco {
namespace {

// Ctrl-C during a wait on peers (core/interrupt.h). Python runs its signal handlers only between
// bytecodes, so a wait with the GIL released held KeyboardInterrupt back until the network
// timeout (or an elastic joiner's start_timeout). The main thread's waits run the handlers here;
// an exception one raises ends the wait (its communication aborted and joined), and is raised
// again once the call returns to Python (the Interrupted translator). A handler that raises
// nothing (one that sets a flag to stop after the step) lets the wait go on.
unsigned long g_main_thread = 0;
std::mutex g_raised_mu;
PyObject *g_raised_type = nullptr, *g_raised_value = nullptr, *g_raised_traceback = nullptr;

bool python_interrupted() {
  if (PyThread_get_thread_ident() != g_main_thread || !Py_IsInitialized()) return false;
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return false;
  std::lock_guard<std::mutex> lock(g_raised_mu);
  Py_XDECREF(g_raised_type);
  Py_XDECREF(g_raised_value);
  Py_XDECREF(g_raised_traceback);
  PyErr_Fetch(&g_raised_type, &g_raised_value, &g_raised_traceback);
  return true;
}

void raise_interrupted(const Interrupted& e) {
  std::lock_guard<std::mutex> lock(g_raised_mu);
  if (g_raised_type == nullptr) {  // no handler's exception kept: a KeyboardInterrupt saying where
    PyErr_SetString(PyExc_KeyboardInterrupt, e.what());
    return;
  }
  PyErr_Restore(g_raised_type, g_raised_value, g_raised_traceback);  // takes the references
  g_raised_type = g_raised_value = g_raised_traceback = nullptr;
}

// v's values as a numpy array that owns them (no copy: a state's tensors and a fragment's average
// can be the model's size).
py::array_t<float> take_array(std::vector<float>&& v) {
  auto* owned = new std::vector<float>(std::move(v));
  py::capsule free(owned, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>({py::ssize_t(owned->size())}, {py::ssize_t(sizeof(float))}, owned->data(), free);
}

// s's bytes as a numpy array that owns them (no copy: a fragment's encoded outer gradients).
py::array_t<uint8_t> take_bytes(std::string&& s) {
  auto* owned = new std::string(std::move(s));
  py::capsule free(owned, [](void* p) { delete static_cast<std::string*>(p); });
  return py::array_t<uint8_t>({py::ssize_t(owned->size())}, {py::ssize_t(1)},
                              reinterpret_cast<const uint8_t*>(owned->data()), free);
}

// One member of a world of processes or threads: its transport (with the link model, if any).
// A member of an elastic run (join_url set) has a transport of its own only (a world of one):
// its method's rounds connect to the members of their moment (elastic/session.h).
struct Endpoint {
  Endpoint(std::shared_ptr<Transport> t, CommOptions c) : transport(std::move(t)), comm(c) {}
  std::shared_ptr<Transport> transport;
  CommOptions comm;
  std::string join_url, worker;  // elastic: redis://HOST:PORT/RUN and this worker's name
  LinkConfig link;               // elastic: the link model over the rounds' connections
  // Set while a method uses the endpoint: two methods on one transport would mix their messages.
  std::shared_ptr<std::atomic<bool>> busy = std::make_shared<std::atomic<bool>>(false);
  int rank() const { return transport->rank(); }
  int size() const { return transport->size(); }
};

LinkConfig link_from(const std::string& bandwidth, const std::string& latency, bool tcp) {
  return {parse_bandwidth(bandwidth, "network.bandwidth"), parse_latency(latency, "network.latency"), tcp};
}

std::shared_ptr<Transport> with_link(std::unique_ptr<Transport> t, const LinkConfig& link) {
  if (link.enabled()) return wrap_with_link(std::move(t), link, real_clock());
  return t;
}

CommOptions comm_options(const std::string& timeout) {
  CommOptions o;
  o.timeout_s = parse_timeout(timeout, "network.timeout");
  return o;
}

std::vector<Endpoint> inprocess_world(int size, const std::string& bandwidth, const std::string& latency, bool tcp,
                                      const std::string& timeout) {
  if (size < 1 || size > 4096) fail("an in-process world needs 1 to 4096 members, got " + std::to_string(size));
  const LinkConfig link = link_from(bandwidth, latency, tcp);
  std::vector<Endpoint> out;
  for (auto& t : make_inprocess_transports(size)) out.push_back({with_link(std::move(t), link), comm_options(timeout)});
  return out;
}

Endpoint elastic_world(const std::string& url, const std::string& worker, const std::string& bandwidth,
                       const std::string& latency, bool tcp, const std::string& timeout) {
  parse_join_url(url);  // a malformed address fails here, before a model is wrapped
  check_worker_name(worker);
  Endpoint e{std::move(make_inprocess_transports(1)[0]), comm_options(timeout)};
  e.join_url = url;
  e.worker = worker;
  e.link = link_from(bandwidth, latency, tcp);
  return e;
}

// The MPI transport behind a handle that finalize_mpi can cut: Python objects (a Sync kept in a
// global) may outlive the interpreter's exit handlers, and MPI's objects must go before
// MPI_Finalize. After the cut every use fails with a clear error.
class Detachable : public Transport {
 public:
  explicit Detachable(std::shared_ptr<Transport> inner)
      : inner_(std::move(inner)), rank_(inner_->rank()), size_(inner_->size()), name_(inner_->name()) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  SendTiming send(int peer, int channel, std::string message) override {
    return get()->send(peer, channel, std::move(message));
  }
  std::string recv(int peer, int channel, double timeout_s) override { return get()->recv(peer, channel, timeout_s); }
  void abort(const std::string& reason) override {
    std::shared_ptr<Transport> t;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t = inner_;
    }
    if (t) t->abort(reason);
  }
  std::string name() const override { return name_; }
  const Clock& clock() const override { return *clock_; }
  std::shared_ptr<Transport> detach() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(inner_);
  }

 private:
  std::shared_ptr<Transport> get() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!inner_) fail("MPI was finalized (loco's exit handler); this member can no longer communicate");
    return inner_;
  }
  std::mutex mu_;
  std::shared_ptr<Transport> inner_;
  const int rank_, size_;
  const std::string name_;
  std::shared_ptr<Clock> clock_ = real_clock();
};

class Method;
std::mutex mpi_mu;
bool mpi_started = false;
std::shared_ptr<Detachable> mpi_transport;
std::set<Method*> live_methods;  // under mpi_mu

Endpoint mpi_world(const std::string& bandwidth, const std::string& latency, bool tcp, const std::string& timeout) {
  std::lock_guard<std::mutex> lock(mpi_mu);
  if (mpi_started) fail("loco.init: MPI is already initialized in this process (call init once)");
  auto t = make_mpi_transport();
  mpi_started = true;
  mpi_transport = std::make_shared<Detachable>(with_link(std::move(t), link_from(bandwidth, latency, tcp)));
  return {mpi_transport, comm_options(timeout)};
}

// A step's access (algo/algorithm.h) for Python: (gradients, ranges of the parameters read,
// ranges written), as (begin, end) pairs.
py::tuple access_tuple(const StepAccess& a) {
  auto pairs = [](const std::vector<Range>& rs) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const auto& r : rs) out.emplace_back(r.begin, r.end);
    return out;
  };
  return py::make_tuple(a.gradients, pairs(a.reads), pairs(a.writes));
}

// What the members of a run must share: the config and tensors (foreign_fingerprint) and what
// the caller adds (`identity`: architecture, inner optimizer, frozen parameters).
nlohmann::json fingerprint_of(const RunConfig& cfg, const std::vector<ForeignTensor>& tensors,
                              const std::map<std::string, std::string>& identity) {
  auto out = foreign_fingerprint(cfg, tensors);
  for (const auto& [k, v] : identity) out[k] = v;
  return out;
}

// A training method around a foreign model's flat parameter and gradient buffers.
class Method {
 public:
  // `inner`: for an elastic endpoint, the object whose save_inner() -> bytes and
  // load_inner(bytes) hold the caller's inner optimizer state (what a joiner receives).
  // `identity`: what else the members must share, described by the caller (the model's
  // architecture beyond its shapes, the inner optimizer's kind and settings, its frozen
  // parameters' values), compared with the run's configuration: at join in an elastic run, by
  // broadcast_params() in a fixed world.
  // host_gradients: the caller keeps its gradients in grads() (loco.torch's CPU model); else the
  // gradient buffer exists only for a method that reads gradients.
  Method(const Endpoint& ep, const std::vector<std::string>& settings, const std::vector<ForeignTensor>& tensors,
         int num_blocks, py::object inner, std::map<std::string, std::string> identity, bool host_gradients)
      : busy_(claim(ep)),
        release_{busy_},
        cfg_(make_config(settings, tensors, num_blocks, !ep.join_url.empty())),
        traffic_(std::make_shared<TrafficStats>(ep.comm.peak_window_s)),
        comm_(ep.transport, ep.comm, std::make_shared<TraceRecorder>(false, ep.rank()), kDataChannel, traffic_),
        w_(cfg_, comm_, ParamLayout::foreign(tensors, num_blocks, cfg_.model.num_heads, cfg_.model.num_kv_heads),
           false),
        inner_(std::move(inner)),
        fingerprint_(fingerprint_of(cfg_, tensors, identity)),
        algo_(ep.join_url.empty() ? make_algorithm(cfg_, w_) : make_elastic(ep)),
        share_{comm_.rank(), comm_.size()} {
    if (cfg_.distributed.replicas != comm_.size() && cfg_.distributed.replicas != 1)
      fail("distributed.replicas (" + std::to_string(cfg_.distributed.replicas) + ") differs from the world size (" +
           std::to_string(comm_.size()) + "); leave it unset");
    params_at_ = w_.params.data();
    // 4 bytes per trained parameter that a method reading no gradients of a model on a GPU never touches.
    if (host_gradients || algo().uses_gradients(w_)) w_.grads = zeroed_floats(size_t(w_.trainable.size()));
    grads_at_ = w_.grads.data();
    std::lock_guard<std::mutex> lock(mpi_mu);
    live_methods.insert(this);
    release_.armed = false;  // close() frees the endpoint from now on
  }
  ~Method() {
    // Collected by Python (the lock held): other threads may be what this member's last
    // operations wait for, so they run without it.
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      close();
    } else {
      close();
    }
    std::lock_guard<std::mutex> lock(mpi_mu);
    live_methods.erase(this);
  }

  // Ends communication before the buffers it may write into go (after an error: at once).
  // Called without Python's lock: the other members' threads must be able to run. Once: the
  // endpoint it frees may already serve the next method when this one is collected.
  void close() {
    if (closed_.exchange(true)) return;
    // The peers learn why (a refusal every member reaches, such as agree()'s, may reach a peer
    // still in the collective as this abort: it then reads this member's reason, not a bare failure).
    if (failed_)
      comm_.abort("member " + std::to_string(comm_.rank()) + "'s training method failed" +
                  (failure_.empty() ? std::string() : ": " + failure_.substr(0, 600)));
    comm_.shutdown();
    // An elastic member leaves the run (its heartbeat stops): the others drop it at their next round.
    if (elastic_) algo_.reset();
    busy_->store(false);
  }

  // Every member takes member 0's parameters (the replicas must start equal), once every
  // member's configuration, tensors and identity are found equal to member 0's (an elastic run
  // compares them at join).
  void broadcast_params() {
    guard([&] {
      if (comm_.size() == 1) return;  // a lone member's are member 0's
      if (!elastic_) agree();
      std::string bytes;
      if (comm_.rank() == 0) bytes.assign(reinterpret_cast<const char*>(w_.params.data()), w_.params.size() * 4);
      auto h = comm_.broadcast_start(&bytes, 0, "broadcast");
      comm_.wait(h);
      if (bytes.size() != w_.params.size() * 4)
        fail("member 0 sent " + std::to_string(bytes.size()) + " bytes of parameters, expected " +
             std::to_string(w_.params.size() * 4) + ": the members' models differ");
      if (comm_.rank() != 0) std::memcpy(w_.params.data(), bytes.data(), bytes.size());
    });
  }
  // Every member of a fixed world fails, naming each difference, unless all fingerprints equal
  // member 0's: members with other settings, another architecture or optimizer, or other frozen
  // weights would train on without a word (loco sends neither settings nor frozen parameters).
  void agree() {
    const auto all = comm_.all_gather(fingerprint_.dump(), "fingerprint");
    if (all.size() != size_t(comm_.size())) fail("internal: the members' fingerprints are incomplete");
    const auto first = nlohmann::json::parse(all[0], nullptr, false);
    std::string why;
    for (size_t k = 1; k < all.size(); ++k) {
      const auto theirs = nlohmann::json::parse(all[k], nullptr, false);
      const std::string diff = first.is_object() && theirs.is_object()
                                   ? fingerprint_differences(theirs, first, "member " + std::to_string(k), "member 0")
                                   : "a malformed fingerprint";
      if (!diff.empty()) why += (why.empty() ? "" : "; ") + diff.substr(0, 400);
    }
    if (!why.empty())
      fail("the members must share their settings, model and inner optimizer, and start from the same frozen "
           "parameters; they differ from member 0's (" + why + ")");
  }
  void start(bool resumed) {
    guard([&] {
      w_.step = step_;
      algo().start(w_, resumed);
      step_ = algo().continue_from(step_);  // an elastic joiner continues from the run's step
      check(w_.params.data() == params_at_, "internal: the method moved its parameter buffers");
    });
  }
  // Before the inner optimizer's step: the gradients of step `step_` are in grads().
  void on_gradients() {
    guard([&] {
      w_.step = step_;
      algo().on_gradients(w_);
    });
  }
  // After it: step_ + 1 inner steps are done.
  void after_step() {
    at_coming_step([&](int64_t done, bool last) {
      algo().after_step(w_, done, last);
      step_ = algo().continue_from(done);  // an elastic member that rejoined: the run's step
      check(w_.params.data() == params_at_ && w_.grads.data() == grads_at_,
            "internal: the method moved its parameter buffers");
    });
  }

  // What the hooks of the step that ends with `step_ + 1` steps done will use (access_tuple).
  py::tuple access() {
    StepAccess a;
    at_coming_step([&](int64_t done, bool last) { a = algo().access(w_, done, last); });
    return access_tuple(a);
  }
  // The first part of the coming step (algo/algorithm.h: merge_step): what it uses, as access(),
  // then the part itself; after_step does the rest.
  py::tuple merge_access() {
    StepAccess a;
    at_coming_step([&](int64_t done, bool last) { a = algo().merge_access(w_, done, last); });
    return access_tuple(a);
  }
  void merge_step() {
    at_coming_step([&](int64_t done, bool last) { algo().merge_step(w_, done, last); });
  }
  // The syncs in flight prepared ahead of their merge (algo/algorithm.h), on loco.torch's thread;
  // `synced`: fragment -> a float32 array (loco.torch's page-locked buffer for the copy to the
  // device) into which its synchronized values are written.
  void prepare_merges(const py::dict& synced) {
    std::map<size_t, SyncedBuffer> into;  // the arrays stay alive in `synced` for the call
    for (auto item : synced) {
      auto a = py::array_t<float, py::array::c_style>::ensure(item.second);
      if (!a || !a.writeable() || a.ptr() != item.second.ptr())  // a converted copy's writes would be lost
        fail("internal: prepare_merges takes writable, contiguous float32 arrays");
      into[item.first.cast<size_t>()] = SyncedBuffer{a.mutable_data(), int64_t(a.size())};
    }
    guard([&] { algo().prepare_merges(into); });
  }
  std::vector<size_t> merges_ahead() const { return algo().merges_ahead(); }
  // The first step after the coming one whose access() may use anything (algo/algorithm.h).
  int64_t quiet_until() {
    int64_t out = 0;
    at_coming_step([&](int64_t done, bool last) { out = algo().quiet_until(w_, done, last); });
    return out;
  }
  bool uses_gradients() const { return algo().uses_gradients(w_); }

  // loco.torch's outer_device (algo/algorithm.h, OuterResult): the caller holds the outer state.
  void hold_outer() {
    if (elastic_) fail("outer_device: an elastic run keeps its outer state on the host; use outer_device=\"cpu\"");
    const std::string why = algo().outer_elsewhere_refusal();
    if (!why.empty()) fail("outer_device: " + why + "; use outer_device=\"cpu\"");
    algo().hold_outer_elsewhere();
  }
  // Each fragment's (begin, end, packed, trained) segments.
  std::vector<std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>> outer_segments() const {
    std::vector<std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>> out;
    for (const auto& f : algo().outer_segments()) {
      out.emplace_back();
      for (const auto& x : f) out.back().emplace_back(x.begin, x.end, x.packed, x.trained);
    }
    return out;
  }
  std::vector<size_t> outer_starts() {
    std::vector<size_t> out;
    at_coming_step([&](int64_t done, bool last) { out = algo().outer_starts(w_, done, last); });
    return out;
  }
  int outer_shards() const { return algo().outer_shards(w_); }
  // The encoded outer gradient of `fragment` (uint8 arrays: one, or one per shard).
  // Called from loco.torch's background thread: the bytes (a fragment's, tens of MB for a large
  // model) are copied without Python's lock, so that the training loop's thread runs meanwhile
  // (the arrays stay alive: the caller holds them for the call).
  void provide_outer(size_t fragment, const std::vector<py::array_t<uint8_t, py::array::c_style>>& parts) {
    std::vector<std::pair<const char*, size_t>> views;
    for (const auto& a : parts) views.emplace_back(reinterpret_cast<const char*>(a.data()), size_t(a.size()));
    guard([&] {
      std::vector<std::string> payloads;
      for (const auto& [at, n] : views) payloads.emplace_back(at, n);
      algo().provide_outer(fragment, std::move(payloads));
    });
  }
  // The syncs completed by the last after_step (or merge_step), each a dict; a codec's payloads
  // come as a list of uint8 arrays (each member's or shard's, owning the bytes received) and
  // their sizes.
  py::list take_outer_results() {
    std::vector<OuterResult> results;
    guard([&] { results = algo().take_outer_results(); });
    return outer_results(std::move(results));
  }
  // The syncs completed ahead of their merge, each once (algo/algorithm.h: peek_outer_results),
  // as take_outer_results gives them; called on loco.torch's background thread.
  py::list peek_outer_results() {
    std::vector<OuterResult> results;
    guard([&] { results = algo().peek_outer_results(); });
    return outer_results(std::move(results));
  }
  static py::list outer_results(std::vector<OuterResult> results) {
    py::list out;
    for (auto& r : results) {
      std::vector<int64_t> sizes;
      py::list bytes;  // each member's (or shard's) payload, as received: no copy on the loop's thread
      for (auto& x : r.payloads) {
        sizes.push_back(int64_t(x.size()));
        bytes.append(take_bytes(std::move(x)));
      }
      out.append(py::dict(py::arg("fragment") = r.fragment, py::arg("take") = r.take, py::arg("replace") = r.replace,
                          py::arg("own") = r.own, py::arg("avg") = r.avg.empty() ? py::object(py::none()) : take_array(std::move(r.avg)),
                          py::arg("payloads") = bytes, py::arg("sizes") = sizes,
                          py::arg("reduce_scatter") = r.reduce_scatter, py::arg("in_params") = r.in_params));
    }
    return out;
  }
  void set_outer_norms(double outer, double replica) { algo().set_outer_norms(outer, replica); }
  // The merges made by the caller from values taken ahead (algo/algorithm.h): whether the method
  // has them.
  bool mix_merges_elsewhere() { return algo().mix_merges_elsewhere(); }

  py::array params(py::object self) { return view(w_.params, self); }
  py::array grads(py::object self) { return view(w_.grads, self); }
  // The parameters to evaluate and save (the outer parameters for DiLoCo), a copy.
  py::array eval_params() {
    std::vector<float> out;
    guard([&] {
      w_.step = step_ > 0 ? step_ - 1 : 0;
      out = algo().eval_params(w_);
    });
    return take_array(std::move(out));
  }

  // The method's state (outer parameters, momentum, ...) and the step, for checkpoints.
  py::dict state() {
    TrainingState st;
    guard([&] { algo().save_state(st); });
    py::dict d;
    for (auto& [name, v] : st.tensors) d[py::str(name)] = take_array(std::move(v));
    py::dict meta;
    for (const auto& [k, v] : st.meta) meta[py::str(k)] = v;
    d["__meta__"] = meta;
    d["__step__"] = step_;
    return d;
  }
  // A state from a file is hostile until checked: every entry an array of finite numbers (the
  // methods' states hold no other; a NaN loaded would spread through every later round), the
  // metadata a dict, the step an integer within the run, all before anything is changed. An
  // entry the method does not read, or one it needs and misses, is refused during the load, which
  // leaves the method failed (a new one is made to go on).
  void load_state(const py::dict& d) {
    TrainingState st;
    for (auto item : d) {
      const std::string name = py::str(item.first);
      if (name == "__step__" || name == "__meta__") continue;
      auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(item.second);
      if (!a) fail("state entry " + name + " is not an array of numbers");
      const int64_t bad = first_non_finite(a.data(), int64_t(a.size()));
      if (bad >= 0)
        fail("state entry " + name + " holds a non-finite value (" + std::to_string(a.data()[bad]) + ") at index " +
             std::to_string(bad));
      st.tensors[name].assign(a.data(), a.data() + a.size());
    }
    if (d.contains("__meta__")) {
      if (!py::isinstance<py::dict>(d["__meta__"])) fail("the state's __meta__ is not a dict");
      for (auto item : d["__meta__"].cast<py::dict>())
        st.meta[py::str(item.first)] = py::str(item.second);
    }
    if (elastic_)
      fail("an elastic member takes the run's state when it joins; load_state_dict is for fixed worlds (mpirun, "
           "in-process)");
    if (!d.contains("__step__")) fail("the state has no __step__");
    const py::object at = d["__step__"];
    if (!py::isinstance<py::int_>(at) || py::isinstance<py::bool_>(at))
      fail("the state's __step__ is " + std::string(py::str(py::type::of(at).attr("__name__"))) + ", not an integer");
    const int64_t step = at.cast<int64_t>();
    if (step < 0 || step > cfg_.train.steps)
      fail("the state's step " + std::to_string(step) + " is outside [0, train.steps = " +
           std::to_string(cfg_.train.steps) + "]");
    guard([&] {
      algo().load_state(st);
      st.check_all_taken("load_state_dict");
      w_.restored = true;
      step_ = step;
    });
  }

  // This member's metrics: traffic, waits, the algorithm's own fields (as written to
  // metrics.jsonl by `loco train`), as JSON text.
  std::string metrics() {
    nlohmann::json rec;
    rec["step"] = step_;
    rec["bytes_sent"] = traffic_->bytes_sent();
    rec["bytes_received"] = traffic_->bytes_received();
    rec["messages_sent"] = traffic_->messages_sent();
    rec["comm_wait_s"] = wait_seconds();
    algo().annotate(rec);
    return rec.dump();
  }
  std::string report() {
    nlohmann::json out;
    algo().report(out);
    out["traffic"] = traffic_->to_json();
    return out.dump();
  }

  // Collective: a metrics record as `loco train` writes it (metrics.jsonl): the members' mean
  // loss and wait, their tokens so far and bytes summed; every member gets it, member 0 writes it.
  std::string record(double loss, int64_t tokens, double val_loss, double seconds) {
    std::vector<double> sums;
    guard([&] {
      sums = comm_.sum_doubles({loss, double(tokens), double(traffic_->bytes_sent()), wait_seconds()}, "metrics");
    });
    nlohmann::json rec;
    rec["step"] = step_;
    rec["tokens"] = int64_t(sums[1]);
    rec["train_loss"] = sums[0] / comm_.size();
    rec["bytes_sent"] = int64_t(sums[2]);
    rec["comm_wait"] = sums[3] / comm_.size();
    rec["time"] = seconds;
    if (!std::isnan(val_loss)) rec["val_loss"] = val_loss;
    algo().annotate(rec);
    return rec.dump();
  }
  // Collective: every member's entry of summary.json's "workers" (traffic by operation, time
  // waiting on peers, the rest of `seconds` counted as compute), in rank order.
  std::vector<std::string> worker_summaries(double seconds) {
    nlohmann::json me = traffic_->to_json();
    const double wait = wait_seconds();
    me["rank"] = comm_.rank();
    me["replica"] = comm_.rank();
    me["stage"] = 0;
    me["wall_s"] = seconds;
    me["comm_wait_s"] = wait;
    me["compute_s"] = std::max(0.0, seconds - wait);
    me["compute_utilization"] = seconds > 0 ? std::max(0.0, seconds - wait) / seconds : 0.0;
    me["param_bytes"] = int64_t(w_.params.size() * 4);
    me["trainable_params"] = w_.trainable.size();
    me["steps_run"] = step_;
    algo().report(me);
    std::vector<std::string> all;
    guard([&] { all = comm_.all_gather(me.dump(), "metrics"); });
    return all;
  }

  int64_t step() const { return step_; }
  // The ranges of the flat parameter buffer this member trains (all of it but with partial
  // updates), as (begin, end) pairs, and the size of the compact gradient buffer.
  std::vector<std::pair<int64_t, int64_t>> trainable_ranges() const {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const auto& r : w_.trainable.ranges()) out.emplace_back(r.begin, r.end);
    return out;
  }
  // (slot, members): this member's share of the data for the current steps. A fixed world:
  // (rank, size); an elastic run: its place among the members of the last round.
  std::pair<int, int> data_share() const { return share_; }
  int64_t log_interval() const { return cfg_.train.log_interval; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  std::string config_toml() const { return run_config_to_toml(cfg_); }

 private:
  static std::shared_ptr<std::atomic<bool>> claim(const Endpoint& ep) {
    if (ep.busy->exchange(true))
      fail("this endpoint already runs a training method (one per member: close() it before wrapping another "
           "model)");
    return ep.busy;
  }
  // Releases the endpoint when construction fails after claiming it.
  struct Release {
    std::shared_ptr<std::atomic<bool>> busy;
    bool armed = true;
    ~Release() {
      if (armed) busy->store(false);
    }
  };

  static RunConfig make_config(const std::vector<std::string>& settings, const std::vector<ForeignTensor>& tensors,
                               int num_blocks, bool elastic) {
    // The model is the caller's: its blocks are the fragment units, its MLP projections' hidden
    // units what partial updates slice. Defaults resolved as for `loco train` (the methods'
    // paper values); an elastic member's config checked as one.
    int64_t f = 0, q = 0;
    for (const auto& t : tensors) {
      if (t.mlp == "gate" || t.mlp == "up" || t.mlp == "down") f = t.rows;
      if (t.mlp == "q") q = t.rows;
    }
    std::vector<std::string> all{"model.num_layers=" + std::to_string(std::max(1, num_blocks))};
    if (f > 0) all.push_back("model.intermediate_size=" + std::to_string(f));
    if (q > 0) all.push_back("model.hidden_size=" + std::to_string(q));  // the query heads' units
    all.insert(all.end(), settings.begin(), settings.end());
    if (elastic) all.push_back("distributed.backend=\"elastic\"");
    RunConfig cfg = load_run_config("", all);
    if (cfg.partial.slices > 1) {
      if (f == 0)
        fail("partial.slices > 1 slices the MLP's hidden units, and this model has no parameter named like "
             "*gate_proj.weight, *up_proj.weight or *down_proj.weight inside a block");
      if (cfg.partial.strategy == "mlp+heads" && q == 0)
        fail("partial.strategy = \"mlp+heads\" slices the attention heads too, and this model has no parameter named "
             "like *q_proj.weight, *k_proj.weight and *v_proj.weight inside a block");
    }
    return cfg;
  }

  // The elastic method of cfg_.algorithm, its session given this model's hooks: the caller's
  // inner optimizer state (inner_) for joiners, and the data share of each round's members.
  std::unique_ptr<Algorithm> make_elastic(const Endpoint& ep) {
    if (inner_.is_none()) fail("internal: an elastic method needs the inner optimizer's state hooks");
    ElasticOptions o = elastic_options(cfg_, ep.join_url, ep.worker);
    o.link = ep.link;
    o.fingerprint = fingerprint_.dump();
    o.foreign = std::make_shared<ForeignWorker>();
    // Called on this member's own thread, inside a hook that released Python's lock. A Python
    // exception becomes loco's error here, with the lock held: no Python object crosses the
    // session's code, which runs without it.
    o.foreign->save_inner = [this] {
      py::gil_scoped_acquire lock;
      try {
        return inner_.attr("save_inner")().cast<std::string>();
      } catch (py::error_already_set& e) {
        fail(std::string("saving the inner optimizer's state for a joiner: ") + e.what());
      }
    };
    o.foreign->load_inner = [this](const std::string& bytes) {
      py::gil_scoped_acquire lock;
      try {
        inner_.attr("load_inner")(py::bytes(bytes));
      } catch (py::error_already_set& e) {
        fail(std::string("installing the inner optimizer's state received: ") + e.what());
      }
    };
    o.foreign->assign_data = [this](int slot, int members) { share_ = {slot, members}; };
    elastic_ = true;
    return make_elastic_algorithm(cfg_, w_, o, traffic_, std::make_shared<TraceRecorder>(false, 0));
  }

  Algorithm& algo() const {
    if (!algo_) fail("this training method was closed");
    return *algo_;
  }

  // Time blocked on peers: the communicator's waits and the algorithm's own (as loco train's).
  double wait_seconds() const { return comm_.wait_seconds() + algo().wait_seconds(); }

  py::array view(std::vector<float>& v, py::object self) {
    return py::array_t<float>({py::ssize_t(v.size())}, {py::ssize_t(4)}, v.data(), self);
  }

  // f(done, last) for the coming step (the one that ends with step_ + 1 steps done), under guard,
  // with the worker at that step.
  template <class F>
  void at_coming_step(F&& f) {
    guard([&] {
      w_.step = step_;
      const int64_t done = step_ + 1;
      f(done, done == cfg_.train.steps);
    });
  }

  template <class F>
  void guard(F&& f) {
    if (failed_) fail("this training method failed earlier; make a new one");
    try {
      py::gil_scoped_release release;
      f();
    } catch (const std::exception& e) {
      failed_ = true;
      failure_ = e.what();
      throw;
    } catch (...) {
      failed_ = true;
      throw;
    }
  }

  std::shared_ptr<std::atomic<bool>> busy_;
  Release release_;  // frees the endpoint if the constructor fails past this point
  RunConfig cfg_;
  std::shared_ptr<TrafficStats> traffic_;
  Communicator comm_;
  Worker w_;
  py::object inner_;  // elastic: the inner optimizer's state hooks (None otherwise)
  nlohmann::json fingerprint_;  // what every member must share: compared at join, or by agree()
  bool elastic_ = false;
  std::unique_ptr<Algorithm> algo_;
  std::pair<int, int> share_;  // this member's data slot and the members sharing the data
  int64_t step_ = 0;
  bool failed_ = false;
  std::string failure_;  // what failed, for the peers (close()'s abort)
  std::atomic<bool> closed_{false};
  const float* params_at_ = nullptr;
  const float* grads_at_ = nullptr;
};

// Encodes and decodes like the outer gradients of Streaming DiLoCo (outer.codec).
py::tuple codec_roundtrip(const std::string& name, py::array_t<float, py::array::c_style | py::array::forcecast> x,
                          const std::string& rounding, int block, uint64_t seed) {
  auto codec = make_codec({name, rounding, block, 0.1});
  std::vector<float> in(x.data(), x.data() + x.size());
  std::string bytes;
  std::vector<float> out(in.size(), 0.0f);
  {
    py::gil_scoped_release release;
    Rng rng(seed);
    bytes = codec->encode(in.data(), int64_t(in.size()), rng);
    codec->decode_add(bytes, out.data(), int64_t(out.size()));
  }
  return py::make_tuple(take_array(std::move(out)), py::bytes(bytes));
}

std::vector<std::string> config_keys() {
  RunConfig cfg;
  std::vector<std::string> keys;
  for (const auto& [k, v] : run_config_schema(cfg).values()) keys.push_back(k);
  return keys;
}

}  // namespace
}  // namespace loco

PYBIND11_MODULE(_loco, m) {
  using namespace loco;
  m.doc() = "loco's C++ core: communicators, codecs and the low-communication training methods";
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  // Tried before Error's (pybind11 tries the last registered first).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Interrupted& e) {
      raise_interrupted(e);
    }
  });
  g_main_thread = py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  set_interrupt_check(python_interrupted);

  py::class_<Endpoint>(m, "Endpoint")
      .def_property_readonly("rank", &Endpoint::rank)
      .def_property_readonly("size", &Endpoint::size)
      .def_property_readonly("worker", [](const Endpoint& e) { return e.worker; })
      .def("abort", [](Endpoint& e, const std::string& why) { e.transport->abort(why); });
  m.def("inprocess_world", &inprocess_world, py::arg("size"), py::arg("bandwidth") = "inf", py::arg("latency") = "0ms",
        py::arg("tcp") = false, py::arg("timeout") = "60s",
        "Endpoints of `size` members of one process (threads), with the link model if given");
  m.def("elastic_world", &elastic_world, py::arg("url"), py::arg("worker"), py::arg("bandwidth") = "inf",
        py::arg("latency") = "0ms", py::arg("tcp") = false, py::arg("timeout") = "60s",
        "This worker's endpoint of the elastic run at redis://HOST:PORT/RUN, named `worker`");
  m.def("mpi_world", &mpi_world, py::arg("bandwidth") = "inf", py::arg("latency") = "0ms", py::arg("tcp") = false,
        py::arg("timeout") = "60s", "This process's endpoint of the MPI world (under mpirun)");
  m.def("finalize_mpi", [] {
    // Every method's communication ends, then the MPI transport, then MPI itself.
    std::lock_guard<std::mutex> lock(mpi_mu);
    if (!mpi_started) return;
    {
      py::gil_scoped_release release;
      for (Method* method : live_methods) method->close();
      if (mpi_transport) mpi_transport->detach().reset();
      finalize_mpi();
    }
    mpi_transport.reset();
    mpi_started = false;
  });
  m.def("set_threads", [](int n) {
    if (n < 1 || n > 1024) fail("threads must be in [1, 1024], got " + std::to_string(n));
    set_compute_threads(n);
  });
  m.def("threads", [] { return compute_threads(); }, "loco's compute threads");
  m.def("config_keys", &config_keys, "Every run-config key, in schema order");
  m.def("codec_bytes", [](const std::string& codec, int64_t n, int block) {
    if (n < 0 || n > (int64_t(1) << 50)) fail("a value count must be in [0, 2^50], got " + std::to_string(n));
    return make_codec({codec, "nearest", block, 0.1})->encoded_bytes(n);
  }, py::arg("codec"), py::arg("n"), py::arg("block") = 128, "Bytes of n values encoded by an outer-gradient codec");
  m.def("plan_fragments", [](int blocks, int fragment_blocks, const std::string& pattern, int64_t inner_steps) {
    if (blocks < 1 || blocks > 100000 || inner_steps < 1)  // model.num_layers' range
      fail("plan_fragments needs blocks in [1, 100000] and inner_steps >= 1");
    py::list out;
    for (const auto& f : plan_fragments(blocks, fragment_blocks, pattern, inner_steps))
      out.append(py::dict(py::arg("blocks") = f.blocks, py::arg("nonblock") = f.nonblock, py::arg("offset") = f.offset));
    return out;
  }, py::arg("blocks"), py::arg("fragment_blocks"), py::arg("pattern") = "strided", py::arg("inner_steps") = 30,
        "Streaming DiLoCo's fragments: blocks, whether it holds the non-block parameters, sync offset");
  m.def("noloco_groups", [](int replicas, int group_size, uint64_t seed, int64_t k) {
    if (replicas < 1 || replicas > (1 << 20) || group_size < 2 || k < 1)
      fail("noloco_groups needs replicas in [1, 2^20], group_size >= 2, k >= 1");
    return noloco_groups(replicas, group_size, seed, k);
  }, py::arg("replicas"), py::arg("group_size"), py::arg("seed"), py::arg("k"),
        "NoLoCo's groups of outer step k (1-based), as every member derives them");
  m.def("route_permutation", [](int replicas, uint64_t seed, int64_t step, int microbatch, int boundary) {
    if (replicas < 1 || replicas > (1 << 20) || step < 0 || microbatch < 0 || boundary < 0)
      fail("route_permutation needs replicas in [1, 2^20] and step, microbatch, boundary >= 0");
    return route_permutation(replicas, seed, step, microbatch, boundary);
  }, py::arg("replicas"), py::arg("seed"), py::arg("step"), py::arg("microbatch"), py::arg("boundary"),
        "NoLoCo's random pipeline routing: replica r of stage b sends microbatch mb of `step` to replica "
        "perm[r] of stage b + 1, as every worker derives it");
  m.def("outer_step",
        [](py::array_t<float, py::array::c_style> theta, py::array_t<float, py::array::c_style> momentum,
           py::array_t<float, py::array::c_style | py::array::forcecast> avg, double lr, double mu, bool nesterov) {
          const int64_t n = int64_t(theta.size());
          if (int64_t(momentum.size()) != n || int64_t(avg.size()) != n)
            fail("outer_step: theta, momentum and avg must have the same size (" + std::to_string(n) + ", " +
                 std::to_string(momentum.size()) + ", " + std::to_string(avg.size()) + ")");
          if (!theta.writeable() || !momentum.writeable()) fail("outer_step: theta and momentum must be writeable");
          if (!(lr > 0) || !std::isfinite(lr) || !(mu >= 0 && mu < 1))
            fail("outer_step: needs a finite lr > 0 and 0 <= momentum < 1");
          OuterConfig o;
          o.lr = lr;
          o.momentum = mu;
          o.nesterov = nesterov;
          float* t = theta.mutable_data();
          float* v = momentum.mutable_data();
          const float* a = avg.data();
          // The step reads and writes them as separate arrays: one array given twice (or views
          // of one buffer that overlap) would be stepped with its own updates.
          const auto overlap = [n](const float* x, const float* y) { return n > 0 && x < y + n && y < x + n; };
          if (overlap(t, v) || overlap(t, a) || overlap(v, a))
            fail("outer_step: theta, momentum and avg must be separate arrays (two of them share memory)");
          py::gil_scoped_release release;
          outer_sgd_step(t, v, a, n, o);
        },
        py::arg("theta").noconvert(), py::arg("momentum").noconvert(), py::arg("avg"), py::arg("lr"),
        py::arg("momentum_coef"),
        py::arg("nesterov") = true,
        "DiLoCo's outer optimizer, in place: SGD with (Nesterov) momentum on delta = theta - avg, the average "
        "of the replicas' parameters (float32 arrays of one size; theta and momentum updated)");
  m.def("codec_roundtrip", &codec_roundtrip, py::arg("codec"), py::arg("x"), py::arg("rounding") = "nearest",
        py::arg("block") = 128, py::arg("seed") = 0,
        "(decoded values, encoded bytes) of x under an outer-gradient codec");

  py::class_<ForeignTensor>(m, "Tensor")
      .def(py::init([](std::string name, int block, int64_t rows, int64_t cols, std::string mlp) {
             return ForeignTensor{std::move(name), block, rows, cols, std::move(mlp)};
           }),
           py::arg("name"), py::arg("block"), py::arg("rows"), py::arg("cols"), py::arg("mlp") = "");

  py::class_<Method>(m, "Method")
      .def(py::init<const Endpoint&, const std::vector<std::string>&, const std::vector<ForeignTensor>&, int,
                    py::object, std::map<std::string, std::string>, bool>(),
           py::arg("endpoint"), py::arg("settings"), py::arg("tensors"), py::arg("num_blocks"),
           py::arg("inner") = py::none(), py::arg("identity") = std::map<std::string, std::string>(),
           py::arg("host_gradients") = true)
      .def("params", [](py::object self) { return self.cast<Method&>().params(self); })
      .def("grads", [](py::object self) { return self.cast<Method&>().grads(self); })
      .def("broadcast_params", &Method::broadcast_params)
      .def("start", &Method::start, py::arg("resumed") = false)
      .def("on_gradients", &Method::on_gradients)
      .def("after_step", &Method::after_step)
      .def("access", &Method::access)
      .def("merge_access", &Method::merge_access)
      .def("merge_step", &Method::merge_step)
      .def("prepare_merges", &Method::prepare_merges, py::arg("synced") = py::dict())
      .def("merges_ahead", &Method::merges_ahead)
      .def("quiet_until", &Method::quiet_until)
      .def_property_readonly("uses_gradients", &Method::uses_gradients)
      .def("hold_outer", &Method::hold_outer)
      .def("outer_segments", &Method::outer_segments)
      .def("outer_starts", &Method::outer_starts)
      .def_property_readonly("outer_shards", &Method::outer_shards)
      .def("provide_outer", &Method::provide_outer)
      .def("take_outer_results", &Method::take_outer_results)
      .def("peek_outer_results", &Method::peek_outer_results)
      .def("set_outer_norms", &Method::set_outer_norms)
      .def("mix_merges_elsewhere", &Method::mix_merges_elsewhere)
      .def("eval_params", &Method::eval_params)
      .def("state", &Method::state)
      .def("load_state", &Method::load_state)
      .def("metrics", &Method::metrics)
      .def("report", &Method::report)
      .def("record", &Method::record, py::arg("loss"), py::arg("tokens"), py::arg("val_loss"), py::arg("seconds"))
      .def("worker_summaries", &Method::worker_summaries, py::arg("seconds"))
      .def("close", &Method::close, py::call_guard<py::gil_scoped_release>())
      .def("config_toml", &Method::config_toml)
      .def_property_readonly("step", &Method::step)
      .def_property_readonly("data_share", &Method::data_share)
      .def_property_readonly("trainable_ranges", &Method::trainable_ranges)
      .def_property_readonly("log_interval", &Method::log_interval)
      .def_property_readonly("rank", &Method::rank)
      .def_property_readonly("size", &Method::size);
}
