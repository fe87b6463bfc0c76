// Included at the root of each fuzz target: the macro crate's own modules, compiled as they are
// (they refer to each other as `crate::…`, so they must sit at the target's root; `#[path]` is
// relative to this file). Their unit tests are `#[cfg(test)]` and stay out.
#[allow(dead_code)]
#[path = "../dlock-macros/src/attr.rs"]
mod attr;
#[allow(dead_code)]
#[path = "../dlock-macros/src/duration.rs"]
mod duration;
#[allow(dead_code)]
#[path = "../dlock-macros/src/expand.rs"]
mod expand;
#[allow(dead_code)]
#[path = "../dlock-macros/src/template.rs"]
mod template;
