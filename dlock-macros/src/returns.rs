//! The function's return type, as the generated code needs it: how a call that cannot have its
//! lock returns, and a hint that types the body's `?` and `return`.

use proc_macro2::{Ident, Punct, Spacing, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::{GenericArgument, PathArguments, ReturnType, Type};

use crate::expand::local;

/// What the function declares it returns: `-> Ty`, nothing, or the `Output` of the boxed
/// future an `#[async_trait]` method returns.
#[derive(Clone, Copy)]
pub(crate) enum Declared<'a> {
    Type(&'a Type),
    Unit { fn_name_span: Span },
}

impl<'a> Declared<'a> {
    pub(crate) fn of(output: &'a ReturnType, fn_name_span: Span) -> Self {
        match output {
            ReturnType::Type(_, ty) => Declared::Type(ty),
            ReturnType::Default => Declared::Unit { fn_name_span },
        }
    }
}

/// How the call returns when its lock cannot be had or is lost: a `fn(&LockSpec, LockError) -> R`
/// of the runtime's, chosen by the declared return type and spanned on it, so that a type that
/// cannot carry a lock failure is reported there, with a message that says which types can and
/// how to make this one work.
pub(crate) fn on_failure(declared: Declared, krate: &syn::Path) -> TokenStream {
    let ty = match declared {
        Declared::Unit { fn_name_span } => {
            let krate = respan(krate, fn_name_span);
            return quote_spanned!(fn_name_span=> #krate::__private::LockSpec::skips);
        }
        Declared::Type(ty) => ty,
    };
    let (first, last) = outer_spans(ty);
    if is_unit(ty) {
        let krate = respan(krate, first);
        return quote_spanned!(first=> #krate::__private::LockSpec::skips);
    }
    // Recognised by its spelling, so an alias with both parameters counts too (and a type of
    // one's own named `Result` would not fit `core::result::Result`: a type error, here).
    if let Some(err) = result_error(ty).filter(|err| !contains_impl_trait(err)) {
        // `T` may be `impl Trait`, which no turbofish can name; the body's type fixes it.
        let (first, last) = outer_spans(err);
        let krate = respan(krate, first);
        let close = closing_angle(last);
        return quote_spanned!(first=> #krate::__private::LockSpec::returns_err::<_, #err #close);
    }
    let krate = respan(krate, first);
    if contains_impl_trait(ty) {
        // Nothing can name the hidden type: the path itself must reach from the first token to
        // the last, every token of it with the same hygiene (the crate path's) or the compiler
        // shows only the first.
        let name = Ident::new("returns_opaque", Span::call_site().located_at(last));
        return quote_spanned!(first=> #krate::__private::LockSpec::#name);
    }
    // The compiler reports `<Ty as Trait>` on `Ty` itself.
    quote_spanned!(first=> |_, error| <#ty as #krate::FromLockError>::from_lock_error(error))
}

/// The spans of a type's first and last tokens. A path expression whose first token is shown at
/// one and whose last at the other is reported on the whole type (a span cannot be joined on
/// stable Rust).
fn outer_spans(ty: &Type) -> (Span, Span) {
    let mut tokens = ty.to_token_stream().into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |t| t.span());
    let last = tokens.last().map_or(first, |t| match t {
        TokenTree::Group(group) => group.span_close(),
        other => other.span(),
    });
    (first, last)
}

fn closing_angle(span: Span) -> Punct {
    let mut close = Punct::new('>', Spacing::Alone);
    close.set_span(span);
    close
}

/// A dead `return` of the declared type, so that `?` and `return` inside the moved body know what
/// they return (as `tracing::instrument` does).
pub(crate) fn hint(declared: Declared) -> TokenStream {
    let ty = match declared {
        Declared::Unit { .. } => quote!(()),
        Declared::Type(ty) if contains_impl_trait(ty) => return TokenStream::new(),
        Declared::Type(ty) => quote!(#ty),
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

/// `E` of a type written `Result<T, E>` (under any path), or `None`.
fn result_error(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else { return None };
    if path.qself.is_some() {
        return None;
    }
    let last = path.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(Some(_)), Some(Some(err)), None) => Some(err),
        _ => None,
    }
}

fn is_unit(ty: &Type) -> bool {
    match ty {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Paren(paren) => is_unit(&paren.elem),
        Type::Group(group) => is_unit(&group.elem),
        _ => false,
    }
}

pub(crate) fn contains_impl_trait(ty: &Type) -> bool {
    fn any_impl(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|t| match t {
            TokenTree::Ident(i) => i == "impl",
            TokenTree::Group(g) => any_impl(g.stream()),
            _ => false,
        })
    }
    any_impl(ty.to_token_stream())
}

/// `path` with every token shown at `span`, resolving as before: a path the error is reported
/// on must not stretch from the attribute to the return type.
fn respan(path: &syn::Path, span: Span) -> TokenStream {
    fn walk(tokens: TokenStream, span: Span) -> TokenStream {
        tokens
            .into_iter()
            .map(|mut token| {
                if let TokenTree::Group(group) = &token {
                    let mut inner =
                        proc_macro2::Group::new(group.delimiter(), walk(group.stream(), span));
                    inner.set_span(group.span().located_at(span));
                    token = TokenTree::Group(inner);
                } else {
                    token.set_span(token.span().located_at(span));
                }
                token
            })
            .collect()
    }
    walk(path.to_token_stream(), span)
}
