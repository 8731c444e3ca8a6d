#!/bin/sh
# Installs the Debian packages kvpin needs (tools/debian-packages.txt) when
# any is missing. Uses sudo when not root. Does nothing when all are present.
set -e
cd "$(dirname "$0")/.."
missing=""
for p in $(cat tools/debian-packages.txt); do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing Debian packages:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
