// Code the parent project accepts but kvmm's own flags (-Wshadow -Wextra -Werror with
// KVMM_WERROR) reject: it compiles only if those flags stayed on kvmm's targets.
int parent_shadowing(int unused_argument) {
  int value = 1;
  {
    int value = 2;  // shadows: -Wshadow
    return value;
  }
}
