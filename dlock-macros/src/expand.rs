//! Code generation: the function is written back with its signature untouched and its body handed
//! to one runtime call, `__private::locked(spec, locker, key, on_failure, async move { body })`.
//! A method that `#[async_trait]` has already rewritten keeps its shape: the future it boxes is
//! the body handed over (`boxed_future`).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{braced, Attribute, Block, Ident, Signature, Stmt, Visibility};

use crate::attr::{self, Errors, LockerArg};
use crate::boxed_future::{self, BoxedFuture};
use crate::key;
use crate::returns::{self, Declared};
use crate::spec::lock_spec;

/// An `async fn` as it appears as a free function, a method or a trait default: attributes,
/// visibility, signature, the body's inner attributes (`#![allow(…)]`) and its statements.
/// Parsed leniently so methods and free functions share one path.
struct LockedFn {
    attrs: Vec<Attribute>,
    vis: Visibility,
    sig: Signature,
    inner_attrs: Vec<Attribute>,
    stmts: Vec<Stmt>,
}

impl Parse for LockedFn {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig = input.parse()?;
        let body;
        braced!(body in input);
        Ok(LockedFn {
            attrs,
            vis,
            sig,
            inner_attrs: body.call(Attribute::parse_inner)?,
            stmts: body.call(Block::parse_within)?,
        })
    }
}

impl LockedFn {
    /// The function as written, for when the attribute reports a mistake: one mistake must not
    /// cascade into errors at every call site, and the IDE keeps working. The parameters and the
    /// duration constants the arguments name are used, as the expansion would have used them,
    /// so that no "unused" warning follows the error.
    fn written_back(&self, duration_paths: &[syn::ExprPath]) -> TokenStream {
        let LockedFn {
            attrs,
            vis,
            sig,
            inner_attrs,
            stmts,
        } = self;
        let names: Vec<Ident> = key::params(sig)
            .into_iter()
            .map(|param| param.name().clone())
            .collect();
        // An `#[async_trait]` method binds its parameters again inside the boxed block.
        let body = match boxed_future::recognise(&sig.output, stmts) {
            Some(BoxedFuture {
                before,
                box_pin,
                future,
                ..
            }) => {
                let names: Vec<String> = names.iter().map(Ident::to_string).collect();
                let future = boxed_future::with_uses(future, &names);
                quote!(#(#before)* #box_pin(#future))
            }
            None => quote!(#(#stmts)*),
        };
        quote! {
            #(#attrs)* #vis #sig {
                #(#inner_attrs)*
                #(let _ = &#names;)*
                #(let _ = &#duration_paths;)*
                #body
            }
        }
    }
}

/// A name for a local of the expansion, hygienic: a parameter or item of the user's with the
/// same name is neither shadowed by it nor able to reach it.
pub(crate) fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let function = match LockedFn::parse.parse2(item.clone()) {
        Ok(function) => function,
        Err(error) => {
            let error = not_a_function(&item).unwrap_or(error).to_compile_error();
            return quote!(#item #error);
        }
    };
    match expand(args.clone(), &function) {
        Ok(tokens) => tokens,
        Err(error) => {
            let function = function.written_back(&attr::duration_paths(args));
            let error = error.to_compile_error();
            quote!(#function #error)
        }
    }
}

/// The error for an attribute written on an impl block or a trait (above an `#[async_trait]`,
/// say) rather than on one of its methods.
fn not_a_function(item: &TokenStream) -> Option<syn::Error> {
    let (span, what) = match syn::parse2::<syn::Item>(item.clone()).ok()? {
        syn::Item::Impl(block) => (block.impl_token.span, "an impl block"),
        syn::Item::Trait(block) => (block.trait_token.span, "a trait"),
        _ => return None,
    };
    Some(syn::Error::new(
        span,
        format!(
            "`#[distributed_lock]` goes on an `async fn`, not on {what}: write it on each method \
             that takes the lock, inside the block (under `#[async_trait]` too)"
        ),
    ))
}

/// The two shapes of function the attribute takes.
enum Shape<'a> {
    /// `async fn`: the body is the future.
    Async,
    /// A method `#[async_trait]` has rewritten: the boxed future is.
    Boxed(BoxedFuture<'a>),
}

fn expand(args: TokenStream, function: &LockedFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let args = attr::parse(args);
    let shape = if function.sig.asyncness.is_some() {
        Some(Shape::Async)
    } else if let Some(boxed) = boxed_future::recognise(&function.sig.output, &function.stmts) {
        match boxed_future::runs_before_the_lock(&boxed) {
            Some(error) => {
                errors.push(error);
                None
            }
            None => Some(Shape::Boxed(boxed)),
        }
    } else {
        errors.push(syn::Error::new(
            function.sig.fn_token.span(),
            "`#[distributed_lock]` works on `async fn` only (methods under `#[async_trait]` \
             included): make this function `async`",
        ));
        None
    };
    let args = match args {
        Ok(args) => args,
        Err(error) => {
            errors.push(error);
            errors.finish()?;
            unreachable!("an error was pushed")
        }
    };
    let builder = local("__dlock_builder");
    let key = match key::render(&args.key, &args.krate, &function.sig, &builder) {
        Ok(key) => Some(key),
        Err(error) => {
            errors.push(error);
            None
        }
    };
    errors.finish()?;
    let (key, shape) = (
        key.expect("errors are returned above"),
        shape.expect("errors are returned above"),
    );

    let LockedFn {
        attrs,
        vis,
        sig,
        inner_attrs,
        stmts,
    } = function;
    let krate = &args.krate;
    let spec = lock_spec(&args, sig);
    let locker = locker(args.locker.as_ref(), krate);
    let (key_local, locker_local) = (local("__dlock_key"), local("__dlock_locker"));
    let key_expr = &key.expr;
    let prologue = quote! {
        let #key_local: ::std::string::String = #key_expr;
        let #locker_local = #locker;
    };
    let locked = |declared: Declared, future: TokenStream| {
        let on_failure = returns::on_failure(declared, krate);
        quote! {
            #krate::__private::locked(#spec, #locker_local, #key_local, #on_failure, #future).await
        }
    };

    Ok(match shape {
        Shape::Async => {
            let declared = Declared::of(&sig.output, sig.ident.span());
            let hint = returns::hint(declared);
            let call = locked(declared, quote!(async move { #hint #(#stmts)* }));
            quote! {
                #(#attrs)*
                #vis #sig {
                    #(#inner_attrs)*
                    #prologue
                    #call
                }
            }
        }
        // The boxed future stays an `async move` block, so that `#[tracing::instrument]`
        // expanded after this attribute still recognises it and instruments the lock too.
        Shape::Boxed(BoxedFuture {
            output,
            before,
            box_pin,
            future,
        }) => {
            let future = boxed_future::with_uses(future, &key.roots);
            let call = locked(Declared::Type(output), future);
            quote! {
                #(#attrs)*
                #vis #sig {
                    #(#inner_attrs)*
                    #(#before)*
                    #box_pin(async move {
                        #prologue
                        #call
                    })
                }
            }
        }
    })
}

/// `Option<Locker>`: `None` for the default locker, or the `locker = EXPR`, coerced to `&Locker`
/// in a typed `let` (deref coercion applies; a wrong type is reported on `EXPR`, with "expected
/// due to this" on `locker`) and cloned, which ends its borrow before the body moves anything.
fn locker(locker: Option<&LockerArg>, krate: &syn::Path) -> TokenStream {
    let Some(LockerArg { name, expr }) = locker else {
        return quote!(::core::option::Option::None);
    };
    let value = local("__dlock_locker_ref");
    let ty = quote_spanned!(name.span()=> &#krate::Locker);
    quote! {
        ::core::option::Option::Some({
            let #value: #ty = #expr;
            #krate::__private::locker(#value)
        })
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::distributed_lock;

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        distributed_lock(args, item).to_string()
    }

    #[test]
    fn hands_the_body_to_one_runtime_call() {
        let out = expand(
            quote!(key = "acct:<open_id>", ttl = "3s"),
            quote! {
                async fn submit(open_id: &str) -> Result<(), E> { work(open_id).await?; Ok(()) }
            },
        );
        assert!(out.contains(":: dlock :: __private :: locked"), "{out}");
        assert!(
            out.contains("LockSpec :: new (\"submit\" , :: core :: time :: Duration :: from_millis (3000u64) , :: core :: time :: Duration :: from_millis (0u64) , true"),
            "{out}"
        );
        assert!(
            out.contains("__dlock_key , :: dlock :: __private :: LockSpec :: returns_err :: < _ , E > , async move"),
            "{out}"
        );
        assert!(
            out.contains(
                ". label (:: core :: concat ! (:: core :: module_path ! () , \"::\" , \"submit\"))"
            ),
            "{out}"
        );
        assert!(out.contains("push_literal (\"acct:\")"), "{out}");
        assert!(
            out.contains("push_display (& mut __dlock_builder , & open_id)"),
            "{out}"
        );
        assert!(
            out.contains("async fn submit (open_id : & str) -> Result < () , E >"),
            "{out}"
        );
    }

    #[test]
    fn hands_a_given_label_over_as_written() {
        let out = expand(
            quote!(key = "k", label = "billing::submit"),
            quote!(
                async fn f() {}
            ),
        );
        assert!(out.contains(". label (\"billing::submit\")"), "{out}");
    }

    #[test]
    fn hands_permits_over_only_where_given() {
        let f = quote!(
            async fn f() {}
        );
        let out = expand(quote!(key = "k", permits = 3), f.clone());
        assert!(out.contains(". permits (3u32)"), "{out}");
        let out = expand(quote!(key = "k"), f);
        assert!(!out.contains("permits"), "{out}");
    }

    #[test]
    fn unknown_placeholder_lists_the_parameters() {
        let out = expand(
            quote!(key = "a:<user>"),
            quote!(
                async fn f(id: u64, name: &str) {}
            ),
        );
        assert!(
            out.contains(
                "placeholder `<user>` names no parameter; parameters of `f`: `id`, `name`"
            ),
            "{out}"
        );
        // The function is emitted again, so call sites keep compiling, and it uses its
        // parameters as the key would have, so no "unused variable" warning follows the error.
        assert!(
            out.contains(
                "async fn f (id : u64 , name : & str) { let _ = & id ; let _ = & name ; }"
            ),
            "{out}"
        );
    }

    #[test]
    fn rejects_non_async_fn_and_pattern_params() {
        let out = expand(
            quote!(key = "k"),
            quote!(
                fn f() {}
            ),
        );
        assert!(out.contains("works on `async fn` only"), "{out}");
        let out = expand(
            quote!(key = "k:<a>"),
            quote!(
                async fn f((a, b): (u8, u8)) {}
            ),
        );
        assert!(out.contains("`a` is bound by a pattern"), "{out}");
    }

    #[test]
    fn uses_the_crate_override_and_the_locker() {
        let out = expand(
            quote!(key = "k", crate = "::app::dlock", locker = &LOCKS),
            quote!(
                async fn f() {}
            ),
        );
        assert!(
            out.contains("let __dlock_locker_ref : & :: app :: dlock :: Locker = & LOCKS ; :: app :: dlock :: __private :: locker (__dlock_locker_ref)"),
            "{out}"
        );
        assert!(
            !out.contains(":: dlock :: __private :: locked")
                || out.contains(":: app :: dlock :: __private :: locked")
        );
    }

    #[test]
    fn reads_a_duration_constant_in_a_const_block() {
        let out = expand(
            quote!(key = "k", ttl = LOCK_TTL, wait = Self::WAIT),
            quote!(
                async fn f() {}
            ),
        );
        // A ttl is checked by the runtime's bounds, in an item the compiler evaluates as it
        // checks the crate; a wait needs no check.
        assert!(
            out.contains("{ const __DLOCK_TTL : :: core :: time :: Duration = { let __dlock_duration : :: core :: time :: Duration = LOCK_TTL ; :: core :: assert ! (! :: dlock :: __private :: ttl_is_too_short (__dlock_duration) , \"`ttl` must be at least 1ms"),
            "{out}"
        );
        assert!(
            out.contains(":: core :: assert ! (! :: dlock :: __private :: ttl_is_too_long (__dlock_duration) , \"`ttl` must be at most `i64::MAX` milliseconds"),
            "{out}"
        );
        assert!(
            out.contains("const { let __dlock_duration : :: core :: time :: Duration = Self :: WAIT ; __dlock_duration }"),
            "{out}"
        );
        // Under an error, the constants are still used.
        let out = expand(
            quote!(key = "k:<nope>", ttl = LOCK_TTL),
            quote!(
                async fn f() {}
            ),
        );
        assert!(out.contains("let _ = & LOCK_TTL ;"), "{out}");
    }

    #[test]
    fn picks_how_the_call_returns_from_the_declared_type() {
        for (output, on_failure) in [
            (quote!(), ":: dlock :: __private :: LockSpec :: skips"),
            (quote!(-> ()), ":: dlock :: __private :: LockSpec :: skips"),
            (
                quote!(-> std::result::Result<impl Display, AppError>),
                ":: dlock :: __private :: LockSpec :: returns_err :: < _ , AppError >",
            ),
            (
                quote!(-> impl IntoResponse),
                ":: dlock :: __private :: LockSpec :: returns_opaque ,",
            ),
            (
                quote!(-> Option<u32>),
                "| _ , error | < Option < u32 > as :: dlock :: FromLockError > :: from_lock_error (error)",
            ),
        ] {
            let out = expand(
                quote!(key = "k"),
                quote!(
                    async fn f() #output { todo!() }
                ),
            );
            assert!(out.contains(on_failure), "{output}: {out}");
        }
    }

    // Regression (the `key_template` fuzz target's "never panics"): a placeholder path that
    // `template::parse` accepted but that is no Rust field made `Ident::new` panic, and the user
    // saw only "proc macro panicked". Each must be a spanned error instead.
    #[test]
    fn placeholder_paths_rust_cannot_spell_are_errors_not_panics() {
        for key in ["k:<b.4294967296>", "k:<b.\u{345}>", "k:<\u{345}>"] {
            let out = expand(
                quote!(key = #key),
                quote!(
                    async fn f(b: (u8, u8)) {}
                ),
            );
            assert!(out.contains("compile_error"), "{key:?}: {out}");
        }
    }
}
