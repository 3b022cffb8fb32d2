#pragma once
#include <CLI/CLI.hpp>

namespace loco::cli {

// Each adds its subcommand to the app; the callback runs the command.
void add_init(CLI::App& app);
void add_grad(CLI::App& app);
void add_eval(CLI::App& app);
void add_data(CLI::App& app);
void add_train(CLI::App& app);
void add_plot(CLI::App& app);
void add_compare(CLI::App& app);
void add_report(CLI::App& app);
void add_generate(CLI::App& app);
void add_info(CLI::App& app);
void add_simulate(CLI::App& app);
void add_estimate(CLI::App& app);
// `loco simulate pipeline`, added by add_simulate.
void add_simulate_pipeline(CLI::App& simulate);

}  // namespace loco::cli
