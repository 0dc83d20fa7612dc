//! `#[approx_counter(every = N, mode, max_delay_ms, max_keys, upsert)]` on a
//! numeric field, or on the struct with `field = "..."`: a counter written
//! about one time in N. The runtime's `approx_counter` module holds the
//! pattern; this checks the options and generates one accessor per counter,
//! `<field>_counter(&db)`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Attribute, DeriveInput, Ident, LitBool, LitInt, LitStr, Meta, Path, Type};

use crate::ast::{Field, Input};
use crate::attr::{self, Opt};
use crate::ctxt::Ctxt;
use crate::private::Private;

const COUNTER: &str = "approx_counter";
const FIELD: &str = "field";
const EVERY: &str = "every";
const MODE: &str = "mode";
const MAX_DELAY_MS: &str = "max_delay_ms";
const MAX_KEYS: &str = "max_keys";
const UPSERT: &str = "upsert";
const OPTIONS: &[&str] = &[FIELD, EVERY, MODE, MAX_DELAY_MS, MAX_KEYS, UPSERT];
const FIELD_OPTIONS: &[&str] = &[EVERY, MODE, MAX_DELAY_MS, MAX_KEYS, UPSERT];

/// The runtime's limit and defaults, repeated for the messages and the
/// options left out; the expansion asserts that they agree.
const MAX_EVERY: u64 = 1_000_000;
const DEFAULT_MAX_DELAY_MS: u64 = 1_000;
const DEFAULT_MAX_KEYS: u64 = 10_000;

/// How a counter writes, as `mode = "..."` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Sampled,
    Buffered,
    Geometric,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Sampled, Mode::Buffered, Mode::Geometric];

    fn spelling(self) -> &'static str {
        match self {
            Mode::Sampled => "sampled",
            Mode::Buffered => "buffered",
            Mode::Geometric => "geometric",
        }
    }
}

/// The variant's path under `__private`.
impl ToTokens for Mode {
    fn to_tokens(&self, tokens: &mut TokenStream) {
        tokens.extend(match self {
            Mode::Sampled => quote!(Mode::Sampled),
            Mode::Buffered => quote!(Mode::Buffered),
            Mode::Geometric => quote!(Mode::Geometric),
        });
    }
}

/// What the `#[approx_counter]` attributes say, as far as they could be read.
pub struct Counters {
    /// The fields the attributes name, found even when they cannot be
    /// counters: after an error, the fallback still has their accessors.
    named: Vec<Ident>,
    /// The type of the field stored as `_id`, for the fallback.
    named_id: Option<Type>,
    /// Every declaration; `None` after an error.
    spec: Option<Spec>,
}

struct Spec {
    id_ty: Type,
    counters: Vec<Counter>,
}

struct Counter {
    bson_name: String,
    ident: Ident,
    ty: Type,
    every: u64,
    mode: Mode,
    max_delay_ms: u64,
    max_keys: u64,
    upsert: bool,
}

/// One `#[approx_counter]` attribute: where it sits and what it says.
struct Declared<'a> {
    attr: &'a Attribute,
    /// The field it sits on, or `None` on the struct.
    on_field: Option<usize>,
}

/// Parses every `#[approx_counter]`, on the struct and on its fields.
pub fn parse(cx: &Ctxt, input: &DeriveInput, model: &Input) -> Option<Counters> {
    let mut declared: Vec<Declared> = input
        .attrs
        .iter()
        .filter(|a| a.path().is_ident(COUNTER))
        .map(|attr| Declared {
            attr,
            on_field: None,
        })
        .collect();
    if let syn::Data::Struct(s) = &input.data {
        for (i, f) in s.fields.iter().enumerate() {
            if let Some(on_this) = attr::single_on_field(cx, &f.attrs, COUNTER) {
                declared.push(Declared {
                    attr: on_this[0],
                    on_field: Some(i),
                });
            }
        }
    }
    if declared.is_empty() {
        return None;
    }
    let mut out = Counters {
        named: Vec::new(),
        named_id: model
            .fields
            .iter()
            .find(|f| f.bson_name == "_id")
            .map(|f| f.ty.clone()),
        spec: None,
    };
    let id = model.stored_id();
    if id.is_none() {
        let fix = match model.fields.iter().find(|f| f.rust_name == "id") {
            Some(_) => "mark `id` with `#[serde(rename = \"_id\")]`".to_owned(),
            None => "add one, as in `#[serde(rename = \"_id\")] id: String`".to_owned(),
        };
        cx.error_spanned_by(
            declared[0].attr,
            format!("`#[approx_counter]` writes to a document by its `_id`, and `{}` has no field stored as `_id`; {fix}", model.ident),
        );
    }
    let mut counters: Vec<Counter> = Vec::new();
    let mut ok = true;
    for d in &declared {
        let mut named = None;
        let parsed = parse_one(cx, model, d, &mut named);
        // A field declared twice (an error already) still gets one accessor.
        out.named.extend(named.filter(|n| !out.named.contains(n)));
        match parsed {
            Some(c) => {
                if counters.iter().any(|o| o.bson_name == c.bson_name) {
                    cx.error_spanned_by(
                        d.attr,
                        format!(
                            "`{}` has two `#[approx_counter]` declarations; keep one",
                            c.bson_name
                        ),
                    );
                    ok = false;
                } else {
                    counters.push(c);
                }
            }
            None => ok = false,
        }
    }
    out.spec = id.filter(|_| ok).map(|id| Spec {
        id_ty: id.ty.clone(),
        counters,
    });
    Some(out)
}

/// One `#[approx_counter]` as written.
struct Attr<'c> {
    field: Opt<'c, LitStr>,
    every: Opt<'c, LitInt>,
    mode: Opt<'c, Mode>,
    max_delay: Opt<'c, LitInt>,
    max_keys: Opt<'c, LitInt>,
    upsert: Opt<'c, LitBool>,
    /// The keys of `max_delay_ms` and `max_keys`, where the errors about
    /// the mode they need point.
    max_delay_key: Option<Path>,
    max_keys_key: Option<Path>,
    /// Options an unknown option looks like a typo of: they are then not
    /// also "missing".
    meant: Vec<&'static str>,
}

/// One declaration; `named` is set to the field it names as soon as that is
/// known.
fn parse_one(cx: &Ctxt, model: &Input, d: &Declared, named: &mut Option<Ident>) -> Option<Counter> {
    if let Some(i) = d.on_field {
        *named = Some(model.fields[i].ident.clone());
    }
    let attr = attr(cx, d)?;
    if d.on_field.is_none() {
        *named = attr
            .field
            .value()
            .and_then(|l| model.find(&l.value()))
            .map(|f| f.ident.clone());
    }
    check(cx, model, d, attr)
}

fn example(d: &Declared) -> &'static str {
    if d.on_field.is_some() {
        "`#[approx_counter(every = 100)]`"
    } else {
        "`#[approx_counter(field = \"views\", every = 100)]`"
    }
}

/// Reads one declaration's options; `None` when it has none.
fn attr<'c>(cx: &'c Ctxt, d: &Declared) -> Option<Attr<'c>> {
    if !matches!(d.attr.meta, Meta::List(_)) {
        cx.error_spanned_by(
            d.attr,
            format!("`#[approx_counter]` needs options, as in {}", example(d)),
        );
        return None;
    }
    let mut out = Attr {
        field: Opt::new(cx, COUNTER, FIELD),
        every: Opt::new(cx, COUNTER, EVERY),
        mode: Opt::new(cx, COUNTER, MODE),
        max_delay: Opt::new(cx, COUNTER, MAX_DELAY_MS),
        max_keys: Opt::new(cx, COUNTER, MAX_KEYS),
        upsert: Opt::new(cx, COUNTER, UPSERT),
        max_delay_key: None,
        max_keys_key: None,
        meant: Vec::new(),
    };
    for opt in attr::read(cx, d.attr) {
        match opt.name.as_str() {
            // field = "name", on the struct only
            FIELD if d.on_field.is_none() => {
                let lit = opt.lit_str(cx, COUNTER, "field = \"views\"");
                out.field.take(&opt, lit);
            }
            FIELD => cx.error_spanned_by(
                &opt.path,
                "`field` is for `#[approx_counter]` on the struct; on a field, the counter is that field",
            ),
            // every = 100
            EVERY => {
                let lit = opt.lit_int(cx, COUNTER, "every = 100");
                out.every.take(&opt, lit);
            }
            // mode = "sampled" | "buffered" | "geometric"
            MODE => {
                let Some(lit) = opt.lit_str(cx, COUNTER, "mode = \"buffered\"") else {
                    out.mode.set_bad(&opt.path);
                    continue;
                };
                match Mode::ALL.into_iter().find(|m| m.spelling() == lit.value()) {
                    Some(m) => out.mode.set(&lit, m),
                    None => {
                        let hint = attr::hint(&lit.value(), Mode::ALL.map(Mode::spelling));
                        cx.error_spanned_by(
                            &lit,
                            format!("unknown `approx_counter` mode `{}`; expected `sampled` (the default: write `$inc: N` with probability 1/N), `buffered` (count in memory, write every N) or `geometric` (write less often as the count grows){hint}", lit.value()),
                        );
                        out.mode.set_bad(&lit);
                    }
                }
            }
            // max_delay_ms = 1000
            MAX_DELAY_MS => {
                let lit = opt.lit_int(cx, COUNTER, "max_delay_ms = 1000");
                out.max_delay.take(&opt, lit);
                out.max_delay_key.get_or_insert(opt.path.clone());
            }
            // max_keys = 10000
            MAX_KEYS => {
                let lit = opt.lit_int(cx, COUNTER, "max_keys = 10000");
                out.max_keys.take(&opt, lit);
                out.max_keys_key.get_or_insert(opt.path.clone());
            }
            // upsert = true | false
            UPSERT => {
                let lit = opt.lit_bool(cx, COUNTER, "upsert = true");
                out.upsert.take(&opt, lit);
            }
            _ => {
                let expected = if d.on_field.is_some() { FIELD_OPTIONS } else { OPTIONS };
                out.meant
                    .extend(attr::did_you_mean(&opt.name, expected.iter().copied()));
                opt.unknown(cx, COUNTER, expected);
            }
        }
    }
    Some(out)
}

/// Judges one declaration, rule by rule: the limits, the options the mode
/// allows, and the field it counts.
fn check(cx: &Ctxt, model: &Input, d: &Declared, attr: Attr) -> Option<Counter> {
    let every_given = attr.every.given();
    let every = attr.every.get().and_then(|(_, lit)| check_every(cx, &lit));
    // A mode given but not read (reported): the checks that depend on it
    // are skipped.
    let bad_mode = attr.mode.given() && attr.mode.value().is_none();
    let (max_delay_given, max_keys_given) = (attr.max_delay.given(), attr.max_keys.given());
    let max_delay = check_at_least_one(cx, attr.max_delay, MAX_DELAY_MS);
    let max_keys = check_at_least_one(cx, attr.max_keys, MAX_KEYS);
    let mode = attr.mode.get().map(|(_, m)| m);
    if !bad_mode {
        let max_delay_key = attr.max_delay_key.as_ref().filter(|_| max_delay_given);
        check_max_delay_mode(cx, max_delay_key, mode);
        let max_keys_key = attr.max_keys_key.as_ref().filter(|_| max_keys_given);
        check_max_keys_mode(cx, max_keys_key, mode);
    }
    check_every_given(cx, d, every_given, &attr.meant);
    let target = check_named_field(cx, model, d, attr.field, &attr.meant)?;
    check_counter_field(cx, d, target)?;
    Some(Counter {
        bson_name: target.bson_name.clone(),
        ident: target.ident.clone(),
        ty: target.ty.clone(),
        every: every?,
        mode: mode.unwrap_or(Mode::Sampled),
        max_delay_ms: max_delay.unwrap_or(DEFAULT_MAX_DELAY_MS),
        max_keys: max_keys.unwrap_or(DEFAULT_MAX_KEYS),
        upsert: attr.upsert.get().is_some_and(|(_, b)| b.value),
    })
}

/// `every` is the N of "write one time in N": from 2 to [`MAX_EVERY`].
fn check_every(cx: &Ctxt, lit: &LitInt) -> Option<u64> {
    match lit.base10_parse::<u64>() {
        Ok(0) => {
            cx.error_spanned_by(lit, "`approx_counter` option `every` must be at least 2: it is N in \"write one time in N\"");
            None
        }
        Ok(1) => {
            cx.error_spanned_by(lit, "`every = 1` writes every increment, which is an exact counter: drop `#[approx_counter]` and `$inc` the field, or pick an N of 2 or more");
            None
        }
        Ok(n) if n <= MAX_EVERY => Some(n),
        _ => {
            cx.error_spanned_by(
                lit,
                format!(
                    "`approx_counter` option `every` is at most {}",
                    underscored(MAX_EVERY)
                ),
            );
            None
        }
    }
}

/// `max_delay_ms` and `max_keys` are at least 1.
fn check_at_least_one(cx: &Ctxt, slot: Opt<LitInt>, name: &str) -> Option<u64> {
    slot.get()
        .and_then(|(_, lit)| match lit.base10_parse::<u64>() {
            Ok(n) if n >= 1 => Some(n),
            _ => {
                cx.error_spanned_by(
                    &lit,
                    format!("`approx_counter` option `{name}` must be at least 1"),
                );
                None
            }
        })
}

/// `max_delay_ms` (written at `key`) is for `mode = "buffered"` alone.
fn check_max_delay_mode(cx: &Ctxt, key: Option<&Path>, mode: Option<Mode>) {
    if let (Some(key), false) = (key, mode == Some(Mode::Buffered)) {
        cx.error_spanned_by(
            key,
            "`max_delay_ms` applies to `mode = \"buffered\"` only: it bounds how long an increment waits in memory, and the other modes never hold one back",
        );
    }
}

/// `max_keys` (written at `key`) is for the modes that keep keys in
/// memory, not `sampled` (the default).
fn check_max_keys_mode(cx: &Ctxt, key: Option<&Path>, mode: Option<Mode>) {
    let is_sampled = mode.is_none_or(|m| m == Mode::Sampled);
    if let (Some(key), true) = (key, is_sampled) {
        let default = if mode.is_none() {
            " (the default mode)"
        } else {
            ""
        };
        cx.error_spanned_by(
            key,
            format!("`max_keys` bounds the keys a `buffered` or `geometric` counter keeps in memory; a `sampled` counter{default} keeps none"),
        );
    }
}

/// A declaration gives `every`, unless a misspelt option meant it (that
/// is reported).
fn check_every_given(cx: &Ctxt, d: &Declared, every_given: bool, meant: &[&str]) {
    if !every_given && !meant.contains(&EVERY) {
        cx.error_spanned_by(
            d.attr,
            format!(
                "`#[approx_counter]` needs `every`, the N of \"write one time in N\", as in {}",
                example(d)
            ),
        );
    }
}

/// The counter is the field the attribute is on, or, on the struct, the
/// field `field = "..."` names.
fn check_named_field<'m>(
    cx: &Ctxt,
    model: &'m Input,
    d: &Declared,
    field: Opt<LitStr>,
    meant: &[&str],
) -> Option<&'m Field<'m>> {
    if let Some(i) = d.on_field {
        return Some(&model.fields[i]);
    }
    let field_given = field.given();
    match field.get() {
        Some((_, lit)) => model.resolve(cx, &lit, COUNTER, FIELD),
        None if field_given || meant.contains(&FIELD) => None,
        None => {
            cx.error_spanned_by(
                d.attr,
                "`#[approx_counter]` on the struct needs `field = \"...\"`, the counter field; or put the attribute on the field itself",
            );
            None
        }
    }
}

/// A counter is a field serde stores, and not `_id`.
fn check_counter_field(cx: &Ctxt, d: &Declared, target: &Field) -> Option<()> {
    if let Some(why) = target.not_stored {
        cx.error_spanned_by(
            d.attr,
            format!("`{}` cannot be a counter: it is {why}", target.rust_name),
        );
        return None;
    }
    if target.bson_name == "_id" {
        cx.error_spanned_by(
            d.attr,
            "`_id` cannot be a counter: it identifies the document",
        );
        return None;
    }
    Some(())
}

/// `1000000` as `1_000_000`, as the user would write it.
fn underscored(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('_');
        }
        out.push(c);
    }
    out
}

fn accessor(field: &Ident) -> Ident {
    let name = field.to_string();
    format_ident!(
        "{}_counter",
        name.trim_start_matches("r#"),
        span = field.span()
    )
}

impl Counters {
    /// The generated accessors (`hits_counter`...), for `Model::declared`.
    pub fn accessors(&self) -> Vec<Ident> {
        self.spec
            .iter()
            .flat_map(|s| &s.counters)
            .map(|c| accessor(&c.ident))
            .collect()
    }

    pub fn expand(&self, input: &DeriveInput, p: &Private) -> Option<TokenStream> {
        let spec = self.spec.as_ref()?;
        let ident = &input.ident;
        let vis = &input.vis;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        let id_ty = &spec.id_ty;
        let fns = spec.counters.iter().map(|c| {
            let f = accessor(&c.ident);
            let field = &c.bson_name;
            let every = c.every as u32;
            let mode = c.mode;
            let (delay, keys, upsert) = (c.max_delay_ms, c.max_keys as usize, c.upsert);
            let doc = format!(
                "The approximate counter over `{field}`: {} mode, about one write in {every}. See `mongo_patterns::approx_counter`.",
                mode.spelling()
            );
            quote! {
                #[doc = #doc]
                #vis fn #f(db: &#p::Database) -> #p::Counter<Self> {
                    #p::Counter::new(db, #p::CounterSpec {
                        field: #field,
                        every: #every,
                        mode: #p::#mode,
                        max_delay_ms: #delay,
                        max_keys: #keys,
                        upsert: #upsert,
                    })
                }
            }
        });
        let checks = spec.counters.iter().map(|c| {
            let ty = &c.ty;
            let p = p.at(ty.span());
            quote_spanned! {ty.span()=> #p::assert_counter_value::<#ty>(); }
        });
        Some(quote! {
            #[automatically_derived]
            impl #impl_g #p::ApproxCounted for #ident #ty_g #where_g {
                type Id = #id_ty;
            }
            #[automatically_derived]
            impl #impl_g #ident #ty_g #where_g {
                #(#fns)*
            }
            const _: () = {
                #[allow(dead_code)]
                fn __counter_fields #impl_g () #where_g { #(#checks)* }
            };
            const _: () = #p::core::assert!(
                #MAX_EVERY == #p::limits::MAX_EVERY as u64,
                "`#[approx_counter]` checks `every` against another maximum than the runtime's",
            );
            const _: () = #p::core::assert!(
                #DEFAULT_MAX_DELAY_MS == #p::limits::DEFAULT_MAX_DELAY_MS as u64,
                "`#[approx_counter]` fills in another default `max_delay_ms` than the runtime's",
            );
            const _: () = #p::core::assert!(
                #DEFAULT_MAX_KEYS == #p::limits::DEFAULT_MAX_KEYS as u64,
                "`#[approx_counter]` fills in another default `max_keys` than the runtime's",
            );
        })
    }

    /// After an error, an `ApproxCounted` impl and the accessors the
    /// attributes name, so that calls elsewhere add no errors of their own.
    pub fn fallback(&self, input: &DeriveInput, p: &Private) -> Option<TokenStream> {
        if self.named.is_empty() {
            return None;
        }
        let id_ty = match &self.named_id {
            Some(ty) => quote!(#ty),
            None => quote!(()),
        };
        let ident = &input.ident;
        let vis = &input.vis;
        let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
        let fns = self.named.iter().map(|n| {
            let f = accessor(n);
            quote! {
                #vis fn #f(db: &#p::Database) -> #p::Counter<Self> {
                    #p::Counter::new(db, #p::CounterSpec::FALLBACK)
                }
            }
        });
        Some(quote! {
            #[automatically_derived]
            impl #impl_g #p::ApproxCounted for #ident #ty_g #where_g {
                type Id = #id_ty;
            }
            #[automatically_derived]
            impl #impl_g #ident #ty_g #where_g {
                #(#fns)*
            }
        })
    }
}

#[cfg(test)]
mod tests;
