//! Methods that `#[async_trait]` has already rewritten: no longer `async`, they return
//! `Pin<Box<dyn Future<Output = R> + …>>` and end in `Box::pin(…)` of the original body. The
//! attribute locks that boxed future, so it works on trait methods called through `dyn Trait`.
//!
//! Two shapes are recognised (`#[tracing::instrument]` recognises the same):
//! - `Box::pin(async move { … })`, written by async-trait 0.1.43 and later;
//! - `async fn __name(…) { … } Box::pin(__name(…))`, an inner `async fn` called at once with
//!   the method's parameters, written by earlier versions.
//!
//! Only the boxed future is locked: whatever runs before it is created runs when the method is
//! called, without the lock. async-trait writes nothing there that runs (nothing at all since
//! 0.1.43, the inner `async fn` item before), so a statement there was written by hand, and is
//! an error ([`runs_before_the_lock`]) rather than silently unlocked. It is not moved into the
//! lock instead: such a statement usually prepares what the future captures (an `Arc` cloned so
//! that the future is `'static`), and moved into the `async` block it would run later, at the
//! first poll, and often no longer compile.

use proc_macro2::TokenStream;
use quote::{quote, ToTokens};
use syn::{
    Expr, GenericArgument, Item, Local, Pat, PathArguments, ReturnType, Stmt, Type, TypeParamBound,
};

/// The parts of a boxed-future method the expansion rewrites.
pub(crate) struct BoxedFuture<'a> {
    /// `R` of `dyn Future<Output = R>`: what the method's callers get.
    pub output: &'a Type,
    /// The statements before the last one, kept as they are (the inner `async fn` of the older
    /// shape is one of them). [`runs_before_the_lock`] says whether one of them runs.
    pub before: &'a [Stmt],
    /// The `Box::pin` call's path, as written.
    pub box_pin: &'a Expr,
    /// Its argument: the future of the original body.
    pub future: &'a Expr,
}

/// Recognises a boxed-future method from its (non-`async`) return type and statements.
pub(crate) fn recognise<'a>(output: &'a ReturnType, stmts: &'a [Stmt]) -> Option<BoxedFuture<'a>> {
    let output = future_output(output)?;
    let (last, before) = stmts.split_last()?;
    let Stmt::Expr(Expr::Call(call), None) = last else {
        return None;
    };
    let Expr::Path(path) = &*call.func else {
        return None;
    };
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if !segments.ends_with(&["Box".into(), "pin".into()]) || call.args.len() != 1 {
        return None;
    }
    let future = &call.args[0];
    let recognised = match future {
        Expr::Async(_) => true,
        Expr::Call(inner) => calls_inner_async_fn(&inner.func, before),
        _ => false,
    };
    recognised.then_some(BoxedFuture {
        output,
        before,
        box_pin: &call.func,
        future,
    })
}

/// The error for code of a recognised boxed-future method that would run when the method is
/// called, before the lock is taken, on the first such part: a statement before `Box::pin`
/// (an item runs nothing and is accepted), or, in the older shape, an argument of the inner
/// `async fn`'s call that is not a plain name (async-trait passes the parameters).
pub(crate) fn runs_before_the_lock(boxed: &BoxedFuture<'_>) -> Option<syn::Error> {
    let statement = boxed.before.iter().find(|stmt| match stmt {
        // `macro_rules!` defines; any other macro may expand to code that runs.
        Stmt::Item(Item::Macro(item)) => item.ident.is_none(),
        Stmt::Item(_) => false,
        Stmt::Local(_) | Stmt::Expr(..) | Stmt::Macro(_) => true,
    });
    if let Some(statement) = statement {
        return Some(syn::Error::new_spanned(
            statement,
            "this statement would run without the lock: `#[distributed_lock]` locks only the \
             future this function boxes, and what comes before `Box::pin` runs as soon as the \
             function is called; move it into the `async move` block, or make the function an \
             `async fn`",
        ));
    }
    let Expr::Call(call) = boxed.future else {
        return None;
    };
    let argument = call
        .args
        .iter()
        .find(|arg| !matches!(arg, Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some()))?;
    Some(syn::Error::new_spanned(
        argument,
        "this argument would be evaluated without the lock: `#[distributed_lock]` locks only \
         the future this call returns, and its arguments are evaluated before it; pass the \
         function's parameters only, or make the function an `async fn`",
    ))
}

/// Whether `func` names an `async fn` declared among `stmts`.
fn calls_inner_async_fn(func: &Expr, stmts: &[Stmt]) -> bool {
    let Expr::Path(path) = func else { return false };
    let Some(name) = path.path.segments.last() else {
        return false;
    };
    stmts.iter().any(|stmt| {
        matches!(stmt, Stmt::Item(Item::Fn(inner))
            if inner.sig.asyncness.is_some() && inner.sig.ident == name.ident)
    })
}

/// `R` of a return type `Pin<Box<dyn Future<Output = R> + …>>`, under any paths.
fn future_output(output: &ReturnType) -> Option<&Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let pinned = single_type_argument(ty, "Pin")?;
    let boxed = single_type_argument(pinned, "Box")?;
    let Type::TraitObject(object) = boxed else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let last = bound.path.segments.last()?;
        if last.ident != "Future" {
            return None;
        }
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

/// `T` of a type written `Name<T>` (under any path).
fn single_type_argument<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.iter().collect::<Vec<_>>().as_slice() {
        [GenericArgument::Type(inner)] => Some(inner),
        _ => None,
    }
}

/// `future`, with `let _ = &name;` after each `let name = name;` of its own that moves one of
/// `names` in. async-trait moves every parameter into its block that way, and the key is rendered
/// outside that block: a parameter only the key uses would be reported as an unused variable
/// where the block binds it again.
pub(crate) fn with_uses(future: &Expr, names: &[String]) -> TokenStream {
    let Expr::Async(block) = future else {
        return future.to_token_stream();
    };
    let mut block = block.clone();
    let stmts = std::mem::take(&mut block.block.stmts);
    for stmt in stmts {
        let moved_in = moved_in(&stmt).filter(|name| names.iter().any(|n| *name == n));
        let used = moved_in.map(|name| syn::parse_quote!(let _ = &#name;));
        block.block.stmts.push(stmt);
        block.block.stmts.extend(used);
    }
    quote!(#block)
}

/// `name` of a statement `let name = name;` (`mut` allowed).
fn moved_in(stmt: &Stmt) -> Option<&syn::Ident> {
    let Stmt::Local(Local {
        pat: Pat::Ident(pat),
        init: Some(init),
        ..
    }) = stmt
    else {
        return None;
    };
    let Expr::Path(path) = &*init.expr else {
        return None;
    };
    (init.diverge.is_none() && pat.subpat.is_none() && path.path.is_ident(&pat.ident))
        .then_some(&pat.ident)
}

#[cfg(test)]
mod tests {
    use quote::quote;

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        crate::expand::distributed_lock(args, item).to_string()
    }

    /// `#[async_trait]` (0.1.44 and later) on `async fn submit(&self, open_id: &str) -> R`.
    #[test]
    fn locks_the_future_async_trait_boxes() {
        let out = expand(
            quote!(key = "acct:<open_id>"),
            quote! {
                fn submit<'life0, 'life1, 'async_trait>(&'life0 self, open_id: &'life1 str)
                    -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u32, AppError>>
                        + ::core::marker::Send + 'async_trait>>
                where 'life0: 'async_trait, 'life1: 'async_trait, Self: 'async_trait
                {
                    Box::pin(async move {
                        let __self = self;
                        let __ret: Result<u32, AppError> = { __self.work(open_id).await };
                        __ret
                    })
                }
            },
        );
        assert!(!out.contains("compile_error"), "{out}");
        assert!(
            out.contains("Box :: pin (async move { let __dlock_key"),
            "{out}"
        );
        assert!(
            out.contains("push_display (& mut __dlock_builder , & open_id)"),
            "{out}"
        );
        assert!(
            out.contains(
                "LockSpec :: returns_err :: < _ , AppError > , async move { let __self = self ;"
            ),
            "{out}"
        );
        assert!(out.ends_with("__ret }) . await }) }"), "{out}");
    }

    /// `#[async_trait]` before 0.1.44: an inner `async fn`, called at once.
    #[test]
    fn locks_the_inner_async_fn_of_older_async_trait() {
        let out = expand(
            quote!(key = "acct:<open_id>"),
            quote! {
                fn submit<'life0, 'async_trait>(&'life0 self, open_id: &'life0 str)
                    -> Pin<Box<dyn Future<Output = ()> + Send + 'async_trait>>
                {
                    async fn __submit<AsyncTrait: ?Sized + Accounts + Sync>(_self: &AsyncTrait, open_id: &str) {
                        _self.work(open_id).await
                    }
                    Box::pin(__submit::<Self>(self, open_id))
                }
            },
        );
        assert!(!out.contains("compile_error"), "{out}");
        assert!(
            out.contains("} Box :: pin (async move { let __dlock_key"),
            "{out}"
        );
        assert!(
            out.contains("LockSpec :: skips , __submit :: < Self > (self , open_id)) . await })"),
            "{out}"
        );
    }

    /// What runs before the boxed future is created runs unlocked: an error on it, not a
    /// function that silently does part of its work outside the lock.
    #[test]
    fn code_that_would_run_before_the_lock_is_an_error() {
        let statement = "this statement would run without the lock";
        for (stmt, expected) in [
            (quote!(let calls = self.count();), statement),
            (quote!(self.count();), statement),
            (quote!(println!("called");), statement),
            (quote!(thread_local! { static N: u8 = 0; }), statement),
        ] {
            let out = expand(
                quote!(key = "k"),
                quote! {
                    fn f(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
                        #stmt
                        Box::pin(async move { self.work().await })
                    }
                },
            );
            assert!(out.contains(expected), "{stmt}: {out}");
            // Written back as it was, so that its callers keep compiling.
            assert!(out.contains(&format!("{stmt} Box :: pin")), "{stmt}: {out}");
        }
        // The older shape's call, with an argument computed at call time.
        let out = expand(
            quote!(key = "k"),
            quote! {
                fn f(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
                    async fn __f(n: u32) {}
                    Box::pin(__f(self.count()))
                }
            },
        );
        assert!(
            out.contains("this argument would be evaluated without the lock"),
            "{out}"
        );
    }

    /// Items run nothing: a helper declared before the `Box::pin` is accepted, and the
    /// future locked.
    #[test]
    fn items_before_the_boxed_future_are_accepted() {
        let out = expand(
            quote!(key = "k"),
            quote! {
                fn f(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
                    fn helper() {}
                    const LIMIT: u32 = 3;
                    macro_rules! twice { ($e:expr) => { $e; $e } }
                    Box::pin(async move { twice!(helper()) })
                }
            },
        );
        assert!(!out.contains("compile_error"), "{out}");
        assert!(
            out.contains("Box :: pin (async move { let __dlock_key"),
            "{out}"
        );
    }

    #[test]
    fn a_boxed_future_of_another_shape_is_not_async() {
        let out = expand(
            quote!(key = "k"),
            quote! {
                fn f(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
                    let future = self.work();
                    Box::pin(future)
                }
            },
        );
        assert!(out.contains("works on `async fn` only"), "{out}");
    }
}
