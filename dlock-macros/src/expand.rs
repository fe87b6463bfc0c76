//! Code generation: the function is written back with its signature untouched and its body handed
//! to one runtime call, `__private::locked(spec, locker, key, async move { body })`.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::parse::{Parse, ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{
    braced, Attribute, Block, FnArg, Ident, Pat, ReturnType, Signature, Stmt, Type, Visibility,
};

use crate::attr::{self, Args, Errors, OnLost};
use crate::template::{self, Segment};

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

impl ToTokens for LockedFn {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        let LockedFn {
            attrs,
            vis,
            sig,
            inner_attrs,
            stmts,
        } = self;
        tokens.extend(quote!(#(#attrs)* #vis #sig { #(#inner_attrs)* #(#stmts)* }));
    }
}

/// A name for a local of the expansion, hygienic: a parameter or item of the user's with the
/// same name is neither shadowed by it nor able to reach it.
fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// A parameter a placeholder may name.
enum Param {
    /// `name: Type` or the receiver; `type_span` is where a `Display` error is shown, and
    /// `name_span` where the name resolves (a parameter named by a `macro_rules!` caller
    /// resolves in that caller's context, not in the type's).
    Named {
        name: String,
        name_span: Span,
        type_span: Span,
    },
    /// A name bound inside a destructuring pattern, which placeholders may not use.
    InPattern { name: String, pattern_span: Span },
}

pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let function = match LockedFn::parse.parse2(item.clone()) {
        Ok(function) => function,
        Err(error) => {
            let error = error.to_compile_error();
            return quote!(#item #error);
        }
    };
    match expand(args, &function) {
        Ok(tokens) => tokens,
        // Re-emit the function as written, so one mistake does not cascade into errors at every
        // call site and the IDE keeps working.
        Err(error) => {
            let error = error.to_compile_error();
            quote!(#function #error)
        }
    }
}

fn expand(args: TokenStream, function: &LockedFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let args = attr::parse(args);
    if function.sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            function.sig.fn_token.span(),
            "`#[distributed_lock]` works on `async fn` only: make this function `async`. \
             (Under `#[async_trait]`, use native `async fn` in the trait instead.)",
        ));
    }
    let args = match args {
        Ok(args) => args,
        Err(error) => {
            errors.push(error);
            errors.finish()?;
            unreachable!("an error was pushed")
        }
    };
    let key = match render_key(&args, &function.sig) {
        Ok(key) => Some(key),
        Err(error) => {
            errors.push(error);
            None
        }
    };
    errors.finish()?;
    let key = key.expect("errors are returned above");

    let LockedFn {
        attrs,
        vis,
        sig,
        inner_attrs,
        stmts,
    } = function;
    let krate = &args.krate;
    let ttl_ms = args.ttl_ms;
    let wait_ms = args.wait_ms;
    let renew = args.renew;
    let on_lost = match args.on_lost {
        OnLost::Cancel => quote!(#krate::__private::OnLost::Cancel),
        OnLost::Continue => quote!(#krate::__private::OnLost::Continue),
    };
    let locker = match &args.locker {
        Some(expr) => quote_spanned! {expr.span()=>
            ::core::option::Option::Some(#krate::__private::locker(#expr))
        },
        None => quote!(::core::option::Option::None),
    };
    let name = sig.ident.to_string();
    let return_hint = return_type_hint(&sig.output);
    // A return type that cannot carry a lock failure is reported on the return type.
    let return_span = match &sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => sig.ident.span(),
    };
    // Naming the conversion here, spanned on the return type, puts a "cannot return a lock
    // failure" error on the return type rather than on the attribute.
    let on_failure = match &sig.output {
        ReturnType::Type(_, ty) if !contains_impl_trait(ty) => quote_spanned! {return_span=>
            <#ty as #krate::FromLockError>::from_lock_error
        },
        ReturnType::Type(..) => quote!(#krate::FromLockError::from_lock_error),
        ReturnType::Default => {
            quote_spanned!(return_span=> <() as #krate::FromLockError>::from_lock_error)
        }
    };
    let (key_local, locker_local) = (local("__dlock_key"), local("__dlock_locker"));
    let call = quote! {
        #krate::__private::locked(
            #krate::__private::LockSpec::new(#name, #ttl_ms, #wait_ms, #renew, #on_lost),
            #locker_local,
            #key_local,
            #on_failure,
            async move {
                #return_hint
                #(#stmts)*
            },
        )
        .await
    };

    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner_attrs)*
            let #key_local: ::std::string::String = #key;
            let #locker_local = #locker;
            #call
        }
    })
}

/// A dead `return` of the declared type, so that `?` and `return` inside the moved body know what
/// they return (as `tracing::instrument` does).
fn return_type_hint(output: &ReturnType) -> TokenStream {
    let ty = match output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) if contains_impl_trait(ty) => return TokenStream::new(),
        ReturnType::Type(_, ty) => quote!(#ty),
    };
    let value = local("__dlock_return");
    quote! {
        #[allow(
            unknown_lints, unreachable_code, clippy::diverging_sub_expression,
            clippy::let_unit_value, clippy::unreachable, clippy::empty_loop, clippy::needless_return
        )]
        if false {
            let #value: #ty = loop {};
            return #value;
        }
    }
}

fn contains_impl_trait(ty: &Type) -> bool {
    ty.to_token_stream()
        .into_iter()
        .any(|t| matches!(&t, proc_macro2::TokenTree::Ident(i) if i == "impl"))
}

fn collect_params(sig: &Signature) -> Vec<Param> {
    let mut params = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => params.push(Param::Named {
                name: "self".into(),
                name_span: receiver.self_token.span,
                type_span: if receiver.colon_token.is_some() {
                    receiver.ty.span()
                } else {
                    receiver.span()
                },
            }),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(ident) if ident.subpat.is_none() => params.push(Param::Named {
                    name: ident.ident.to_string(),
                    name_span: ident.ident.span(),
                    type_span: typed.ty.span(),
                }),
                pattern => pattern_bindings(pattern, &mut |ident| {
                    params.push(Param::InPattern {
                        name: ident.to_string(),
                        pattern_span: typed.pat.span(),
                    })
                }),
            },
        }
    }
    params
}

/// Calls `found` for every name a destructuring pattern binds.
fn pattern_bindings(pattern: &Pat, found: &mut dyn FnMut(&Ident)) {
    match pattern {
        Pat::Ident(p) => {
            found(&p.ident);
            if let Some((_, sub)) = &p.subpat {
                pattern_bindings(sub, found);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|e| pattern_bindings(e, found)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| pattern_bindings(e, found)),
        Pat::Struct(p) => p
            .fields
            .iter()
            .for_each(|f| pattern_bindings(&f.pat, found)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| pattern_bindings(e, found)),
        Pat::Reference(p) => pattern_bindings(&p.pat, found),
        Pat::Paren(p) => pattern_bindings(&p.pat, found),
        Pat::Type(p) => pattern_bindings(&p.pat, found),
        _ => {}
    }
}

/// The expression that renders the key: literals pushed as written, each placeholder's value
/// pushed through `Display` with percent-encoding. The `Display` requirement is spanned on the
/// parameter's type, so a wrong type is reported where it is declared.
fn render_key(args: &Args, sig: &Signature) -> syn::Result<TokenStream> {
    let lit = &args.key;
    let krate = &args.krate;
    let segments = template::parse(&lit.value()).map_err(|msg| syn::Error::new(lit.span(), msg))?;
    let params = collect_params(sig);
    let mut pushes = Vec::new();
    let mut capacity = 0usize;
    let builder = local("__dlock_builder");
    for segment in &segments {
        match segment {
            Segment::Literal(text) => {
                capacity += text.len();
                pushes.push(quote!(#builder.push_literal(#text);));
            }
            Segment::Placeholder { root, path } => {
                capacity += 16;
                let type_span = find_param(&params, root, lit.span(), sig)?;
                let root_tokens = if root == "self" {
                    quote_spanned!(type_span=> self)
                } else {
                    Ident::new(root, type_span).into_token_stream()
                };
                let fields = path.iter().map(|field| match field.parse::<u32>() {
                    Ok(index) => syn::Index {
                        index,
                        span: type_span,
                    }
                    .into_token_stream(),
                    Err(_) => Ident::new(field, type_span).into_token_stream(),
                });
                pushes.push(quote_spanned! {type_span=>
                    #krate::__private::KeyBuilder::push_display(&mut #builder, &#root_tokens #(.#fields)*);
                });
            }
        }
    }
    Ok(quote! {{
        let mut #builder = #krate::__private::KeyBuilder::with_capacity(#capacity);
        #(#pushes)*
        #builder.finish()
    }})
}

fn find_param(params: &[Param], root: &str, key_span: Span, sig: &Signature) -> syn::Result<Span> {
    for param in params {
        match param {
            Param::Named {
                name,
                name_span,
                type_span,
            } if name == root => return Ok(type_span.resolved_at(*name_span)),
            Param::InPattern { name, pattern_span } if name == root => {
                let mut error = syn::Error::new(
                    *pattern_span,
                    format!(
                        "`{root}` is bound by a pattern; a placeholder needs a parameter with a plain name: \
                         write `param: Type` and use `<param.field>` in the key"
                    ),
                );
                error.combine(syn::Error::new(
                    key_span,
                    format!("placeholder `<{root}>` used here"),
                ));
                return Err(error);
            }
            _ => {}
        }
    }
    let names: Vec<String> = params
        .iter()
        .filter_map(|p| match p {
            Param::Named { name, .. } => Some(format!("`{name}`")),
            Param::InPattern { .. } => None,
        })
        .collect();
    let available = if names.is_empty() {
        format!("`{}` has no named parameters", sig.ident)
    } else {
        format!("parameters of `{}`: {}", sig.ident, names.join(", "))
    };
    Err(syn::Error::new(
        key_span,
        format!("placeholder `<{root}>` names no parameter; {available}"),
    ))
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
            out.contains("LockSpec :: new (\"submit\" , 3000u64 , 0u64 , true"),
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
        // The function is emitted again, so call sites keep compiling.
        assert!(
            out.contains("async fn f (id : u64 , name : & str) { }"),
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
            out.contains(":: app :: dlock :: __private :: locker (& LOCKS)"),
            "{out}"
        );
        assert!(
            !out.contains(":: dlock :: __private :: locked")
                || out.contains(":: app :: dlock :: __private :: locked")
        );
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
