// vrdmad --supervise: this process only starts the backend (this program without --supervise) and
// starts it again when it dies of a crash or a kill, at most kMaxRestarts times a minute. A
// restarted backend that was not a migration destination gets --incoming guest: when the guest's
// state area holds a device state nobody has loaded yet (the backend died between the
// migration's stop and the destination's load), it takes the guest's objects from there, and
// otherwise it starts with none, and (--restarted) tells the guest's driver that any objects it
// had are gone (DEVICE_FATAL). SIGTERM/SIGINT go to the backend and end both.
#pragma once

namespace vrdma::vrdmad {

// Runs the supervisor with vrdmad's own arguments (argv[0] included, --supervise dropped for the
// backend); returns the exit status for main().
int supervise(int argc, char** argv);

}  // namespace vrdma::vrdmad
