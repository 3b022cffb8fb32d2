#include <malloc.h>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  // glibc gives each thread that allocates its own arena, reserving 64 MB of address space
  // each (up to 8 per core). loco's threads allocate little, so a few arenas serve them all and
  // a run's address space stays predictable (see require_memory in core/memory.h).
  mallopt(M_ARENA_MAX, 4);
  CLI::App app{"loco: low-communication distributed training of transformer language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loco 0.1");
  loco::cli::add_init(app);
  loco::cli::add_grad(app);
  loco::cli::add_eval(app);
  loco::cli::add_data(app);
  loco::cli::add_train(app);
  loco::cli::add_plot(app);
  loco::cli::add_compare(app);
  loco::cli::add_generate(app);
  loco::cli::add_info(app);
  loco::cli::add_simulate(app);
  loco::cli::add_estimate(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0 through CLI11; a usage error is one line like every other.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "loco: error: %s (see loco --help)\n", e.what());
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
