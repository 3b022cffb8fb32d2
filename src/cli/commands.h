#pragma once
#include <CLI/CLI.hpp>

namespace loco::cli {

// Each adds its subcommand to the app; the callback runs the command.
void add_init(CLI::App& app);
void add_grad(CLI::App& app);
void add_eval(CLI::App& app);

}  // namespace loco::cli
