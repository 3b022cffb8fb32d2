#include <malloc.h>

#include <csignal>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "core/version.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOCO_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(LOCO_ASAN)
#include "comm/mpi_transport.h"
// Under LeakSanitizer (scripts/sanitize.sh), processes started by mpirun skip the leak check at
// exit: Open MPI, hwloc and the components Open MPI unloads at exit leave allocations behind
// that the check cannot attribute (all 188 reports, when this was added, were theirs, none
// loco's). In-process runs, which share every code path but the MPI transport, keep it.
extern "C" int __lsan_is_turned_off() { return loco::launched_by_mpi() ? 1 : 0; }
#endif

int main(int argc, char** argv) {
  // glibc gives each thread that allocates its own arena, reserving 64 MB of address space
  // each (up to 8 per core). loco's threads allocate little, so a few arenas serve them all and
  // a run's address space stays predictable (see require_memory in core/memory.h).
  mallopt(M_ARENA_MAX, 4);
  // A write to a peer or a coordinator that has gone is an error the caller reports, never a
  // silent death of the process by SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  loco::set_command_line(argc, argv);
  CLI::App app{"loco: low-communication distributed training of transformer language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loco " + loco::loco_version());
  loco::cli::add_init(app);
  loco::cli::add_grad(app);
  loco::cli::add_eval(app);
  loco::cli::add_data(app);
  loco::cli::add_train(app);
  loco::cli::add_plot(app);
  loco::cli::add_compare(app);
  loco::cli::add_report(app);
  loco::cli::add_generate(app);
  loco::cli::add_info(app);
  loco::cli::add_simulate(app);
  loco::cli::add_estimate(app);
  // `loco help [COMMAND [SUBCOMMAND]]`: the same text as --help.
  std::vector<std::string> help_topic;
  auto* help = app.add_subcommand("help", "Print the help of loco or of a command: loco help train, loco help data prepare");
  help->add_option("command", help_topic, "command (and subcommand)");
  help->callback([&] {
    const CLI::App* target = &app;
    std::string name = "loco";
    for (const auto& t : help_topic) {
      const CLI::App* next = nullptr;
      for (const auto* s : target->get_subcommands([](const CLI::App*) { return true; }))
        if (s->get_name() == t) next = s;
      if (!next) throw CLI::ValidationError(name + " has no command " + t);
      target = next;
      name += " " + t;
    }
    std::printf("%s", target->get_formatter()->make_help(target, name, CLI::AppFormatMode::Normal).c_str());
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0 through CLI11; a usage error is one line like every other,
    // pointing at the help of the command it was given to.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string where = "loco";
    for (const CLI::App* cur = &app; !cur->get_subcommands().empty();) {
      cur = cur->get_subcommands().front();
      where += " " + cur->get_name();
    }
    std::fprintf(stderr, "loco: error: %s (see %s --help)\n", e.what(), where.c_str());
    return 1;
  } catch (const loco::Error& e) {
    std::fprintf(stderr, "loco: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "loco: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loco: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
