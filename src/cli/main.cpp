#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
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
    return app.exit(e);
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
