// Swap files must not outlive a run that is ended by a signal: when one rank fails, mpirun ends the
// others with SIGTERM (then SIGKILL), and no destructor runs. Registered files are unlinked by a
// handler for SIGTERM, SIGINT and SIGHUP, which then re-raises the signal with its default action.
// SIGKILL cannot be caught: SwapSpace warns about files of dead processes at the next start.
// Internal to offload.
#pragma once

#include <string>

namespace zs::offload::detail {

// Copies `path` into a fixed table the handler reads (at most 64 files, 4095 bytes each: a longer
// path or a full table is simply not covered, and logged). Installs the handlers on first use.
void register_for_exit_cleanup(const std::string& path);
// Removes `path` from the table (call before unlinking it normally).
void unregister_for_exit_cleanup(const std::string& path);
// Unlinks every registered path now, keeping them registered (a second unlink is a harmless ENOENT).
// Async-signal-safe.
void unlink_registered_files() noexcept;

}  // namespace zs::offload::detail
