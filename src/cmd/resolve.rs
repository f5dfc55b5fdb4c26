//! From function names to planned probe requests, before anything is stopped.

use anyhow::{Result, bail};

use crate::arch::{Arch, Host};
use crate::probe::Request;
use crate::symbols::Module;
use crate::symbols::entries::Entries;
use crate::symbols::image::ElfImage;

/// Resolves and plans each name in `module`; any unknown or refused name is an error.
pub fn requests(module: &Module, names: &[String]) -> Result<Vec<Request>> {
    let mut out: Vec<Request> = Vec::new();
    let entries = Entries::of(&module.elf);
    let image = ElfImage::new(&module.elf, module.bias);
    for name in names {
        let function = module.function(name)?;
        if out.iter().any(|r| r.function.addr == function.addr) {
            continue;
        }
        if function.size == 0 {
            bail!("cannot probe `{name}`: its symbol has no size, so tp cannot check its code");
        }
        let code = module.code_of(&function)?;
        let extra = module.extra_targets(&function);
        let plan = match Host::plan_in(code, function.addr, &extra, &image)
            .and_then(|p| entries.check(&p, module.bias).map(|()| p))
        {
            Ok(p) => p,
            Err(refusal) => bail!("cannot probe `{name}`: {refusal}"),
        };
        out.push(Request { function, plan, span: module.span });
    }
    Ok(out)
}
