// Package deploy holds no Go code of its own: it is the home of the server deployment (systemd
// units, sysusers.d and tmpfiles.d files, the configuration templates and install.sh) and of
// deploy_test.go, which checks them: every unit's hardening and users, `systemd-analyze verify`
// and `security` on each, the signerd policy, and install.sh into a temporary root as root
// (every path of the layout table in docs/deploying.md, owners and modes exact, and a second run
// that changes nothing). See "Deploying on a server" in docs/deploying.md.
package deploy
